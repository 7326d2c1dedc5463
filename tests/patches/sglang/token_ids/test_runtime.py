"""Unit tests of the token-ids runtime: the per-choice id tracker and what it does to SSE chunks.

A small stand-in for ``OpenAIServingChat._generate_chat_stream`` drives the real decorator and tap
with SGLang-shaped engine outputs (``{"text", "output_ids", "meta_info", "index"}``); each scripted
engine output says which chunks the serving code yields for it (0, 1 or several, as a tool-call or
reasoning parser would), so every hold-back case is exercised without SGLang.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Optional

import pytest
from pydantic import BaseModel, model_serializer

from toolkit.patches.sglang.token_ids import runtime

# --------------------------------------------------------------------------------------------------
# a stand-in for SGLang's chat stream


@dataclass
class Step:
    """One engine output: new ids for a choice, and the texts the serving code yields for it."""

    index: int
    ids: list[int]
    chunks: list[str] = field(default_factory=list)  # "" never yields: it stands for no chunk at all
    finish: Optional[str] = None
    tool_call: bool = False  # yield the texts as tool-call deltas instead of content


def engine_outputs(steps: list[Step], *, incremental: bool) -> list[dict]:
    """SGLang's output dicts for ``steps``: cumulative ``output_ids`` by default, only the new ones
    when incremental; ``meta_info.completion_tokens`` always counts every id so far."""
    so_far: dict[int, list[int]] = {}
    outputs = []
    for step in steps:
        ids = so_far.setdefault(step.index, [])
        ids.extend(step.ids)
        outputs.append(
            {
                "text": "".join(step.chunks),
                "output_ids": list(step.ids) if incremental else list(ids),
                "meta_info": {
                    "id": "chatcmpl-1",
                    "completion_tokens": len(ids),
                    "finish_reason": {"type": step.finish} if step.finish else None,
                },
                "index": step.index,
            }
        )
    return outputs


def sse(choice: dict, **top) -> str:
    payload = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [choice], **top}
    return f"data: {json.dumps(payload, separators=(',', ':'), ensure_ascii=False)}\n\n"


def choice(index: int, delta: dict, finish_reason: Optional[str] = None) -> dict:
    return {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish_reason}


class FakeServing:
    """Shaped like OpenAIServingChat: role chunk first, the step's chunks, finish chunks at the end."""

    def __init__(self, steps: list[Step], *, incremental: bool = False, outputs: list[dict] | None = None) -> None:
        self.steps = steps
        self.outputs = outputs if outputs is not None else engine_outputs(steps, incremental=incremental)
        self.tokenizer_manager = SimpleNamespace(
            server_args=SimpleNamespace(stream_output=incremental), generate_request=self._generate
        )
        self.closed = False

    async def _generate(self, adapted_request, raw_request):
        try:
            for output in self.outputs:
                await asyncio.sleep(0)
                yield output
        finally:
            self.closed = True

    @runtime.stream_token_ids
    async def _generate_chat_stream(self, adapted_request, request, raw_request):
        first: set[int] = set()
        finished: dict[int, str] = {}
        steps = iter(self.steps)
        async for content in runtime.tap(self.tokenizer_manager.generate_request(adapted_request, raw_request)):
            step = next(steps)
            index = content["index"]
            if index not in first:
                first.add(index)
                yield sse(choice(index, {"role": "assistant", "content": ""}))
            for text in step.chunks:
                if not text:
                    continue
                if step.tool_call:
                    delta = {"tool_calls": [{"index": 0, "function": {"arguments": text}}]}
                else:
                    delta = {"content": text}
                yield sse(choice(index, delta))
            if content["meta_info"]["finish_reason"]:
                finished[index] = content["meta_info"]["finish_reason"]["type"]
        for index, reason in finished.items():
            yield sse(choice(index, {}, reason))
        yield 'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3}}\n\n'
        yield "data: [DONE]\n\n"


def run_stream(serving: FakeServing, request=None, adapted=None) -> list[str]:
    request = request if request is not None else SimpleNamespace(return_token_ids=True)
    adapted = adapted if adapted is not None else SimpleNamespace(input_ids=[101, 102, 103])

    async def collect():
        return [chunk async for chunk in serving._generate_chat_stream(adapted, request, None)]

    return asyncio.run(collect())


def payloads(chunks: list[str]) -> list[dict]:
    return [json.loads(chunk[len("data: "):]) for chunk in chunks if chunk.startswith("data: {")]


def ids_by_choice(chunks: list[str]) -> dict[int, list[list[int]]]:
    """Each choice's ``token_ids``, chunk by chunk (only chunks that carry the field)."""
    out: dict[int, list[list[int]]] = {}
    for payload in payloads(chunks):
        for item in payload["choices"]:
            if "token_ids" in item:
                out.setdefault(item["index"], []).append(item["token_ids"])
    return out


def joined(chunks: list[str]) -> dict[int, list[int]]:
    return {index: [t for ids in per_chunk for t in ids] for index, per_chunk in ids_by_choice(chunks).items()}


@pytest.fixture(autouse=True)
def no_env_flag(monkeypatch):
    monkeypatch.delenv(runtime.ENV_FLAG, raising=False)


# --------------------------------------------------------------------------------------------------
# output_ids: cumulative and incremental

PLAIN = [
    Step(0, [11], ["Hel"]),
    Step(0, [12, 13], ["lo wo"]),
    Step(0, [14], ["rld"]),
    Step(0, [2], [], finish="stop"),  # EOS: no text
]


def test_cumulative_output_ids_become_the_ids_behind_each_chunk():
    chunks = run_stream(FakeServing(PLAIN))
    assert ids_by_choice(chunks) == {0: [[11], [12, 13], [14], [2]]}


def test_incremental_output_ids_give_the_same_ids_as_cumulative():
    assert run_stream(FakeServing(PLAIN, incremental=True)) == run_stream(FakeServing(PLAIN))


@pytest.mark.parametrize("incremental", [False, True])
def test_concatenated_stream_ids_equal_every_output_id(incremental):
    chunks = run_stream(FakeServing(PLAIN, incremental=incremental))
    assert joined(chunks) == {0: [11, 12, 13, 14, 2]}


def test_incremental_abort_resending_ids_is_capped_by_completion_tokens():
    steps = [Step(0, [11], ["a"]), Step(0, [12], ["b"]), Step(0, [], [], finish="abort")]
    outputs = engine_outputs(steps, incremental=True)
    outputs[-1]["output_ids"] = [12]  # 0.5.23 re-sends the last id with an abort
    chunks = run_stream(FakeServing(steps, incremental=True, outputs=outputs))
    assert joined(chunks) == {0: [11, 12]}


def test_live_cumulative_list_is_copied_past_the_watermark():
    tracker = runtime.StreamTokenIds(incremental=False, prompt_token_ids=None)
    live = [1, 2]
    tracker.observe({"output_ids": live, "meta_info": {"completion_tokens": 2}, "index": 0})
    live.append(3)  # 0.5.23 passes its live list on intermediate outputs
    assert tracker.take(0) == [1, 2]
    tracker.observe({"output_ids": live, "meta_info": {"completion_tokens": 3}, "index": 0})
    assert tracker.take(0) == [3]


# --------------------------------------------------------------------------------------------------
# parsers holding text back


def test_ids_held_back_by_a_parser_go_out_on_the_next_chunk_of_that_choice():
    steps = [
        Step(0, [30], [""], tool_call=True),  # "<tool_call>" held back: no chunk
        Step(0, [31, 32], [""], tool_call=True),  # partial JSON: still nothing
        Step(0, [33], ['{"a": 1}'], tool_call=True),
        Step(0, [2], [], finish="stop"),
    ]
    chunks = run_stream(FakeServing(steps))
    assert ids_by_choice(chunks) == {0: [[30, 31, 32, 33], [2]]}


def test_several_chunks_from_one_engine_output_put_its_ids_on_the_first():
    steps = [Step(0, [40, 41, 42], ["Sure. ", "more"]), Step(0, [43], ["!"], finish="stop")]
    chunks = run_stream(FakeServing(steps))
    assert ids_by_choice(chunks) == {0: [[40, 41, 42], [], [43], []]}


def test_ids_a_parser_never_releases_go_out_on_the_finish_chunk():
    steps = [Step(0, [50], [""]), Step(0, [51], [""]), Step(0, [52], [""], finish="length")]
    chunks = run_stream(FakeServing(steps))
    finish = [p["choices"][0] for p in payloads(chunks) if p["choices"] and p["choices"][0]["finish_reason"]]
    assert finish == [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "length", "token_ids": [50, 51, 52]}]


def test_empty_text_deltas_and_final_eos_keep_their_ids_for_later():
    steps = [
        Step(0, [60], ["Hi"]),
        Step(0, [61], []),  # the detokenizer holds back a partial word
        Step(0, [62], [" there"]),
        Step(0, [2], [], finish="stop"),  # EOS: empty delta
    ]
    chunks = run_stream(FakeServing(steps))
    assert ids_by_choice(chunks) == {0: [[60], [61, 62], [2]]}


@pytest.mark.parametrize("incremental", [False, True])
def test_two_choices_keep_separate_watermarks_and_buffers(incremental):
    steps = [
        Step(0, [1], ["a"]),
        Step(1, [7], [""]),  # choice 1's parser holds back
        Step(0, [2], ["b"]),
        Step(1, [8], ["xy"]),
        Step(1, [9], [], finish="stop"),
        Step(0, [3], [""], finish="stop"),
    ]
    chunks = run_stream(FakeServing(steps, incremental=incremental))
    assert ids_by_choice(chunks) == {0: [[1], [2], [3]], 1: [[7, 8], [9]]}


# --------------------------------------------------------------------------------------------------
# chunk shapes


def test_prompt_token_ids_ride_on_the_first_chunk_only_and_the_role_chunk_has_no_token_ids():
    chunks = run_stream(FakeServing(PLAIN))
    first, *rest = payloads(chunks)
    assert first["prompt_token_ids"] == [101, 102, 103]
    assert "token_ids" not in first["choices"][0]
    assert all("prompt_token_ids" not in p for p in rest)


def test_chunks_without_choices_pass_through_unchanged():
    chunks = run_stream(FakeServing(PLAIN))
    assert chunks[-2] == 'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":3}}\n\n'
    assert chunks[-1] == "data: [DONE]\n\n"
    tracker = runtime.StreamTokenIds(incremental=False, prompt_token_ids=[1])
    for chunk in ('data: {"error":{"message":"x"}}\n\n', 'event: sglext_ids\ndata: {"choices":[],"sglext":{}}\n\n',
                  b"data: {}\n\n", "data: not json\n\n"):
        assert tracker.annotate(chunk) == chunk


def test_added_fields_leave_every_original_byte_in_place():
    vanilla = run_stream(FakeServing(PLAIN), request=SimpleNamespace(return_token_ids=False))
    with_ids = run_stream(FakeServing(PLAIN))
    assert len(vanilla) == len(with_ids)
    for plain, annotated in zip(vanilla, with_ids):
        stripped = annotated
        for payload in payloads([annotated]):
            if "prompt_token_ids" in payload:
                stripped = stripped.replace(f',"prompt_token_ids":{json.dumps(payload["prompt_token_ids"], separators=(",", ":"))}', "")
            for item in payload["choices"]:
                if "token_ids" in item:
                    stripped = stripped.replace(f',"token_ids":{json.dumps(item["token_ids"], separators=(",", ":"))}', "", 1)
        assert stripped == plain


def test_json_it_cannot_locate_choices_in_is_written_anew():
    tracker = runtime.StreamTokenIds(incremental=False, prompt_token_ids=[5])
    tracker.observe({"output_ids": [9], "meta_info": {"completion_tokens": 1}, "index": 0})
    spaced = "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "é"}, "finish_reason": None}]}) + "\n\n"
    out = tracker.annotate(spaced)
    assert out.endswith("\n\n")
    assert json.loads(out[len("data: "):]) == {
        "choices": [{"index": 0, "delta": {"content": "é"}, "finish_reason": None, "token_ids": [9]}],
        "prompt_token_ids": [5],
    }


def test_an_empty_choice_object_gets_valid_json():
    tracker = runtime.StreamTokenIds(incremental=False, prompt_token_ids=None)
    assert runtime._with_fields('{"choices":[{}]}', {"choices": [{}]}, {}, [{"token_ids": [1]}]) == '{"choices":[{"token_ids":[1]}]}'
    assert tracker.annotate('data: {"choices":[{}]}\n\n') == 'data: {"choices":[{}]}\n\n'


# --------------------------------------------------------------------------------------------------
# on and off


def test_off_returns_the_stream_generator_itself():
    serving = FakeServing(PLAIN)
    request = SimpleNamespace(return_token_ids=False)
    stream = serving._generate_chat_stream(SimpleNamespace(input_ids=[1]), request, None)
    assert stream.ag_code is FakeServing._generate_chat_stream.__wrapped__.__code__  # not a wrapper
    assert all("token_ids" not in chunk for chunk in run_stream(FakeServing(PLAIN), request=request))


def test_requests_without_the_field_are_off_by_default():
    assert not runtime.enabled(SimpleNamespace())
    assert not runtime.enabled(SimpleNamespace(return_token_ids=False))
    assert runtime.enabled(SimpleNamespace(return_token_ids=True))


@pytest.mark.parametrize("value,on", [("1", True), ("true", True), ("0", False), ("", False)])
def test_env_flag_turns_ids_on_for_every_request(monkeypatch, value, on):
    monkeypatch.setenv(runtime.ENV_FLAG, value)
    assert runtime.enabled(SimpleNamespace(return_token_ids=False)) is on
    chunks = run_stream(FakeServing(PLAIN), request=SimpleNamespace(return_token_ids=False))
    assert (joined(chunks) == {0: [11, 12, 13, 14, 2]}) is on


def test_a_tap_outside_a_tracked_stream_is_the_iterator_itself():
    outputs = object()
    assert runtime.tap(outputs) is outputs


def test_closing_the_stream_closes_the_engine_generator():
    serving = FakeServing(PLAIN)

    async def first_then_close():
        stream = serving._generate_chat_stream(SimpleNamespace(input_ids=[1]), SimpleNamespace(return_token_ids=True), None)
        await stream.__anext__()
        await stream.aclose()

    asyncio.run(first_then_close())
    assert serving.closed


def test_an_error_before_the_first_chunk_propagates():
    class Failing(FakeServing):
        @runtime.stream_token_ids
        async def _generate_chat_stream(self, adapted_request, request, raw_request):
            raise ValueError("context length exceeded")
            yield  # pragma: no cover

    async def kick_start():  # 0.5.23's _handle_streaming_request does this to answer 400
        stream = Failing(PLAIN)._generate_chat_stream(SimpleNamespace(input_ids=[1]), SimpleNamespace(return_token_ids=True), None)
        await stream.__anext__()

    with pytest.raises(ValueError, match="context length"):
        asyncio.run(kick_start())


def test_incremental_flag_is_read_where_each_version_keeps_it():
    v0523 = SimpleNamespace(tokenizer_manager=SimpleNamespace(incremental_streaming_output=True, server_args=SimpleNamespace()))
    v059 = SimpleNamespace(tokenizer_manager=SimpleNamespace(server_args=SimpleNamespace(stream_output=True)))
    default = SimpleNamespace(tokenizer_manager=SimpleNamespace(server_args=SimpleNamespace()))
    assert runtime.incremental_output_ids(v0523) and runtime.incremental_output_ids(v059)
    assert not runtime.incremental_output_ids(default)


# --------------------------------------------------------------------------------------------------
# non-streaming


def test_prompt_ids_of_an_expanded_parallel_sampling_request_are_one_prompt():
    assert runtime.prompt_ids(SimpleNamespace(input_ids=[[1, 2], [1, 2]])) == [1, 2]
    assert runtime.prompt_ids(SimpleNamespace(input_ids=[1, 2])) == [1, 2]
    assert runtime.prompt_ids(SimpleNamespace(input_ids=None, text="x")) is None
    assert runtime.prompt_ids(SimpleNamespace(input_ids=None), {"prompt_token_ids": [4]}) == [4]


class Choice(BaseModel):  # shaped like SGLang's ChatCompletionResponseChoice, patched
    index: int
    hidden_states: Optional[object] = None
    token_ids: list[int] | None = None

    @model_serializer(mode="wrap")
    @runtime.omit_when_none("token_ids")
    def _serialize(self, handler):
        data = handler(self)
        if self.hidden_states is None:
            data.pop("hidden_states", None)
        return data


class Response(BaseModel):
    id: str
    choices: list[Choice]
    prompt_token_ids: list[int] | None = None

    @model_serializer(mode="wrap")
    @runtime.omit_when_none("prompt_token_ids")
    def _serialize(self, handler):
        return handler(self)


def test_fields_left_none_are_left_out_of_the_json():
    response = Response(id="x", choices=[Choice(index=0)])
    assert response.model_dump_json() == '{"id":"x","choices":[{"index":0}]}'
    assert response.model_dump() == {"id": "x", "choices": [{"index": 0}]}


def test_add_to_response_sets_prompt_and_choice_ids():
    response = Response(id="x", choices=[Choice(index=0), Choice(index=1, hidden_states=[1.5])])
    outputs = [{"output_ids": [5, 6]}, {"output_ids": [7]}]
    same = runtime.add_to_response(response, SimpleNamespace(return_token_ids=True),
                                   SimpleNamespace(input_ids=[[1, 2], [1, 2]]), outputs)
    assert same is response
    assert json.loads(response.model_dump_json()) == {
        "id": "x",
        "choices": [{"index": 0, "token_ids": [5, 6]}, {"index": 1, "hidden_states": [1.5], "token_ids": [7]}],
        "prompt_token_ids": [1, 2],
    }


def test_add_to_response_leaves_vanilla_and_error_responses_alone():
    response = Response(id="x", choices=[Choice(index=0)])
    runtime.add_to_response(response, SimpleNamespace(return_token_ids=False), SimpleNamespace(input_ids=[1]), [{"output_ids": [5]}])
    assert response.model_dump_json() == '{"id":"x","choices":[{"index":0}]}'
    error = SimpleNamespace(status_code=400)
    assert runtime.add_to_response(error, SimpleNamespace(return_token_ids=True), None, []) is error
