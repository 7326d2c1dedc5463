"""The grammar checker: well-formed streams pass; each kind of defect is named."""

from __future__ import annotations

import copy
import json

import pytest

from toolkit.verify.grammar import check_events, compare_outputs, parse_sse
from scripts.support.responses_requests import SCENARIOS
from tests.patches.vllm.responses_stream.support import simulate


def good() -> list[dict]:
    events, _ = simulate(SCENARIOS["reason_text_tools"])
    assert check_events(events) == []
    return events


def index_of(events: list[dict], kind: str, nth: int = 0) -> int:
    return [i for i, e in enumerate(events) if e["type"] == kind][nth]


def renumber(events: list[dict]) -> list[dict]:
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return events


def drop(kind: str, nth: int = 0):
    def mutate(events):
        del events[index_of(events, kind, nth)]
        return renumber(events)
    return mutate


def edit(kind: str, change, nth: int = 0):
    def mutate(events):
        change(events[index_of(events, kind, nth)])
        return events
    return mutate


def set_path(path: str, value):
    def change(event):
        target = event
        keys = path.split(".")
        for key in keys[:-1]:
            target = target[int(key)] if key.isdigit() else target[key]
        target[keys[-1]] = value
    return change


MUTATIONS = {
    "missing item done": (drop("response.output_item.done", 1), "still open"),
    "missing arguments done": (drop("response.function_call_arguments.done"), "done without arguments done"),
    "missing text done": (drop("response.output_text.done"), "content_part.done before"),
    "sequence gap": (lambda ev: ev[:5] + ev[6:], "sequence_number"),
    "event after terminal": (lambda ev: renumber(ev + [copy.deepcopy(ev[5])]), "after the terminal"),
    "no terminal": (lambda ev: ev[:-1], "no terminal event"),
    "two terminals": (lambda ev: renumber(ev + [copy.deepcopy(ev[-1])]), "after the terminal"),
    "completed output id differs": (edit("response.completed", set_path("response.output.1.id", "msg_other")),
                                    "final output differs"),
    "completed output text differs": (
        edit("response.completed", set_path("response.output.1.content.0.text", "other")), "final output differs"),
    "done text is not the deltas": (edit("response.output_text.delta", set_path("delta", "X")),
                                    "is not the joined deltas"),
    "arguments are not the deltas": (edit("response.function_call_arguments.done", set_path("arguments", "{}")),
                                     "is not the joined deltas"),
    "wrong output index": (edit("response.output_item.added", set_path("output_index", 5), 1), "output_index"),
    "wrong content index": (edit("response.content_part.added", set_path("content_index", 1)), "content_index"),
    "wrong item id in a delta": (edit("response.output_text.delta", set_path("item_id", "msg_x")), "item_id"),
    "done item has other text": (edit("response.output_item.done", set_path("item.content.0.text", "z"), 1),
                                 "not the streamed parts"),
    "added item not in progress": (edit("response.output_item.added", set_path("item.status", "completed")),
                                   "expected 'in_progress'"),
    "call without name in done": (edit("response.function_call_arguments.done", set_path("name", "g")), "name"),
    "call id changes": (edit("response.output_item.done", set_path("item.call_id", "call_x"), 2), "call_id"),
    "first event not created": (lambda ev: renumber(ev[1:]), "must begin with response.created"),
    "response id changes": (edit("response.completed", set_path("response.id", "resp_other")), "response id"),
    "incomplete item not last": (edit("response.output_item.done", set_path("item.status", "incomplete"), 0),
                                 "not the last item"),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_checker_names_each_defect(name: str) -> None:
    mutate, expected = MUTATIONS[name]
    problems = check_events(mutate(good()))
    assert problems, f"{name}: not detected"
    assert any(expected in p for p in problems), problems


def test_overlapping_items_are_reported() -> None:
    events = good()
    first_done = index_of(events, "response.output_item.done", 0)
    second_added = index_of(events, "response.output_item.added", 1)
    events.insert(second_added, events.pop(first_done))  # still well numbered below
    problems = check_events(renumber(events))
    assert any("overlap" in p for p in problems), problems


def test_whitespace_only_message_is_a_phantom_item() -> None:
    # upstream vLLM's phantom item between reasoning and a tool call, as it streams it
    rid = {"id": "r", "status": "in_progress", "output": []}
    item = {"id": "msg_1", "type": "message", "role": "assistant", "status": "in_progress", "content": []}
    done_part = {"type": "output_text", "text": "\n\n", "annotations": []}
    done = dict(item, status="completed", content=[done_part])
    events = [
        {"type": "response.created", "response": rid},
        {"type": "response.in_progress", "response": rid},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.content_part.added", "output_index": 0, "item_id": "msg_1", "content_index": 0,
         "part": {"type": "output_text", "text": "", "annotations": []}},
        {"type": "response.output_text.delta", "output_index": 0, "item_id": "msg_1", "content_index": 0,
         "delta": "\n\n"},
        {"type": "response.output_text.done", "output_index": 0, "item_id": "msg_1", "content_index": 0,
         "text": "\n\n"},
        {"type": "response.content_part.done", "output_index": 0, "item_id": "msg_1", "content_index": 0,
         "part": done_part},
        {"type": "response.output_item.done", "output_index": 0, "item": done},
        {"type": "response.completed", "response": dict(rid, status="completed", output=[done])},
    ]
    problems = check_events(renumber(events))
    assert problems == ["event 7 (response.output_item.done): message item with no text (empty or whitespace only)"]


def test_incomplete_terminal_needs_its_reason() -> None:
    events, _ = simulate(["<think>", "abc"], "length")
    assert check_events(events) == []
    del events[-1]["response"]["incomplete_details"]
    assert any("incomplete_details" in p for p in check_events(events))


def test_failed_terminal_needs_its_error() -> None:
    events, _ = simulate(["abc"])
    events[-1] = {"type": "response.failed", "sequence_number": events[-1]["sequence_number"],
                  "response": {"id": "resp_test", "status": "failed", "output": events[-1]["response"]["output"]}}
    assert any("error.message" in p for p in check_events(events))
    events[-1]["response"]["error"] = {"code": "server_error", "message": "boom"}
    assert check_events(events) == []


def test_checker_accepts_pydantic_events() -> None:
    from toolkit.patches.vllm.responses_stream.machine import ResponsesStream
    from tests.patches.vllm.responses_stream.support import wrap

    stream = ResponsesStream()
    events = stream.feed("hello") + stream.finish("stop")
    wrapped = wrap([e for e in events], [i.model_dump(mode="json") for i in stream.items], "completed")
    assert check_events(wrapped) == []


def test_parse_sse_reads_vllm_style_streams() -> None:
    events, _ = simulate(["hi"])
    body = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    assert parse_sse(body) == events


def test_compare_outputs_can_ignore_ids() -> None:
    _, first = simulate(SCENARIOS["reason_tool"])
    _, second = simulate(["".join(SCENARIOS["reason_tool"])])
    assert compare_outputs(first, second, ignore_ids=True) == []
    differences = compare_outputs(first, second)
    assert len(differences) == 2 and "id" in differences[0]
    assert compare_outputs(first, second[:1], ignore_ids=True)[0].startswith("2 items vs 1 items")
