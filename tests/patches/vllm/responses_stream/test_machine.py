"""The streaming state machine driven by scripted deltas, checked by the grammar checker.

Pure Python (no engine): every order of reasoning / text / tool calls, any chunking, and the edge
cases of the issue (an opener split across deltas, empty deltas, EOS inside an argument).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.verify.grammar import check_events
from toolkit.patches.vllm.responses_stream.machine import ResponsesStream
from toolkit.patches.vllm.responses_stream.segmenter import Markers, Segmenter
from scripts.support.responses_requests import SCENARIOS
from tests.patches.vllm.responses_stream.support import EXPECTED, simulate, summary, without_ids

MARKERS = Markers("<think>", "</think>", "<tool_call>", "</tool_call>")


def ok(events: list[dict]) -> None:
    problems = check_events(events)
    assert problems == [], "\n".join(problems)


def text_deltas(events: list[dict]) -> list[str]:
    return [e["delta"] for e in events if e["type"] in ("response.output_text.delta", "response.reasoning_text.delta")]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("chunking", ["whole", "tokens", "chars"])
def test_every_scripted_order_streams_grammatical_items(scenario: str, chunking: str) -> None:
    tokens = SCENARIOS[scenario]
    chunks = {"whole": ["".join(tokens)], "tokens": tokens, "chars": list("".join(tokens))}[chunking]
    events, items = simulate(chunks)
    ok(events)
    assert summary(items) == EXPECTED[scenario]
    for delta in text_deltas(events):
        assert "<tool" not in delta and "<think>" not in delta and "</think>" not in delta


def test_stream_and_whole_output_give_the_same_items() -> None:
    for tokens in SCENARIOS.values():
        _, streamed = simulate(tokens)
        _, whole = simulate(["".join(tokens)])
        assert without_ids(streamed) == without_ids(whole)


def test_a_marker_split_at_any_point_is_never_text() -> None:
    text = "".join(SCENARIOS["reason_text_tools"])
    _, reference = simulate([text])
    for cut in range(1, len(text)):
        events, items = simulate([text[:cut], text[cut:]])
        ok(events)
        assert without_ids(items) == without_ids(reference), cut


def test_tool_call_opener_split_across_deltas() -> None:
    events, items = simulate(["Hi.\n<tool_", "call>\n", '{"name": "f", "arguments": {}}', "\n</tool_call>"])
    ok(events)
    assert summary(items) == [("message", "Hi.", "completed"), ("call", "f", "{}", "completed")]
    assert all("<" not in d for d in text_deltas(events))


def test_empty_deltas_change_nothing() -> None:
    tokens = SCENARIOS["text_tool_text"]
    padded = [piece for token in tokens for piece in ("", token, "")]
    events, items = simulate(padded)
    ok(events)
    assert without_ids(items) == without_ids(simulate(tokens)[1])
    assert all(e.get("delta", "x") != "" for e in events)


def test_eos_in_the_middle_of_an_argument_closes_the_call_incomplete() -> None:
    tokens = SCENARIOS["reason_tool"]
    cut = tokens[: tokens.index("Paris") + 1]
    events, items = simulate(cut, "length")
    ok(events)
    assert summary(items) == [("reasoning", "I need the weather.", "completed"),
                              ("call", "get_weather", '{"city": "Paris', "incomplete")]
    assert events[-1]["type"] == "response.incomplete"
    assert [e["type"] for e in events].count("response.function_call_arguments.done") == 1


def test_eos_after_complete_arguments_without_the_closing_marker_is_a_whole_call() -> None:
    events, items = simulate(["<tool_call>\n", '{"name": "f", "arguments": {"a": {"b": 1}}', "}"], "stop")
    ok(events)
    assert summary(items) == [("call", "f", '{"a": {"b": 1}}', "completed")]
    events, items = simulate(["<tool_call>\n", '{"name": "f", "arguments": {"a": 1}'], "stop")
    ok(events)
    assert summary(items) == [("call", "f", '{"a": 1}', "completed")]


def test_reasoning_only_cut_by_max_tokens() -> None:
    events, items = simulate(["<think>", "\nLet me", " think"], "length")
    ok(events)
    assert summary(items) == [("reasoning", "Let me think", "incomplete")]
    assert events[-1]["type"] == "response.incomplete"


def test_no_phantom_items_from_whitespace() -> None:
    events, items = simulate(["<think>", "\n\n", "</think>", "\n\n", "<tool_call>", '\n{"name": "f", "arguments": {}}\n',
                              "</tool_call>", "\n\n", "  \n"])
    ok(events)
    assert summary(items) == [("call", "f", "{}", "completed")]


def test_text_after_a_tool_call_is_kept() -> None:
    _, items = simulate(SCENARIOS["text_tool_text"])
    assert summary(items)[-1] == ("message", "Done checking.", "completed")


def test_interleaved_reasoning_after_a_tool_call() -> None:
    chunks = ["<think>a</think>", '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
              "<think>b</think>", "done"]
    events, items = simulate(chunks)
    ok(events)
    assert summary(items) == [("reasoning", "a", "completed"), ("call", "f", '{"x": 1}', "completed"),
                              ("reasoning", "b", "completed"), ("message", "done", "completed")]


def test_two_reasoning_blocks_are_two_items() -> None:
    _, items = simulate(["<think>a</think>\n<think>b</think>"])
    assert summary(items) == [("reasoning", "a", "completed"), ("reasoning", "b", "completed")]


def test_arguments_stream_as_they_come_and_join_to_the_done_arguments() -> None:
    tokens = SCENARIOS["reason_tool"]
    events, _ = simulate(tokens)
    deltas = [e["delta"] for e in events if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) >= 3 and "".join(deltas) == '{"city": "Paris"}'
    done = next(e for e in events if e["type"] == "response.function_call_arguments.done")
    assert done["arguments"] == "".join(deltas) and done["name"] == "get_weather"


def test_invalid_tool_call_body_is_text_as_written() -> None:
    events, items = simulate(["<tool_call>not json</tool_call> after"])
    ok(events)
    assert summary(items) == [("message", "<tool_call>not json</tool_call> after", "completed")]


def test_a_tool_call_cut_before_its_name_is_dropped() -> None:
    events, items = simulate(["Hello\n<tool_call>\n", '{"na'], "length")
    ok(events)
    assert summary(items) == [("message", "Hello", "completed")]


def test_a_partial_marker_at_the_end_is_text() -> None:
    events, items = simulate(["Hello <tool_"], "stop")
    ok(events)
    assert summary(items) == [("message", "Hello <tool_", "completed")]


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    events, items = simulate(SCENARIOS["tools_only"], parallel_tool_calls=False)
    ok(events)
    assert summary(items) == [("call", "get_time", '{"zone":"UTC"}', "completed")]


def test_include_reasoning_false_hides_reasoning() -> None:
    events, items = simulate(SCENARIOS["reason_text_tools"], include_reasoning=False)
    ok(events)
    assert [i["type"] for i in items] == ["message", "function_call", "function_call"]


def test_prompt_opened_reasoning_and_a_redundant_opener() -> None:
    events, items = simulate(["<think>\nhmm", "\n</think>\n\nyes"], start_in_reasoning=True)
    ok(events)
    assert summary(items) == [("reasoning", "hmm", "completed"), ("message", "yes", "completed")]
    _, items = simulate(["hmm</think>yes"], start_in_reasoning=True)
    assert summary(items) == [("reasoning", "hmm", "completed"), ("message", "yes", "completed")]


def test_a_stray_reasoning_end_in_text_is_dropped() -> None:
    _, items = simulate(["yes</think> and more"])
    assert summary(items) == [("message", "yes and more", "completed")]


def test_without_parsers_text_is_verbatim() -> None:
    events, items = simulate(["  two spaces", " <think>x</think>  "], markers=Markers())
    ok(events)
    assert summary(items) == [("message", "  two spaces <think>x</think>  ", "completed")]
    events, items = simulate([" ", "\n"], markers=Markers())
    ok(events)
    assert items == []


def test_name_resolution_and_custom_tools() -> None:
    body = '<tool_call>{"name": "ns__f", "arguments": {"x": 1}}</tool_call><tool_call>{"name": "patch", ' \
           '"arguments": {"input": "*** diff"}}</tool_call>'
    events, items = simulate([body], resolve_name=lambda n: (n.split("__")[-1], n.split("__")[0] if "__" in n else None),
                             custom_tool_names={"patch"})
    ok(events)
    assert items[0]["name"] == "f" and items[0]["namespace"] == "ns"
    assert items[1]["type"] == "custom_tool_call" and items[1]["input"] == "*** diff"


def test_a_body_that_is_not_json_is_decoded_by_the_parser() -> None:
    decode = lambda body: [("get_time", '{"zone": "UTC"}')] if "<function=get_time>" in body else None  # noqa: E731
    events, items = simulate(["<tool_call>\n<function=get_time>\n<parameter=zone>UTC</parameter>\n</function>\n",
                              "</tool_call>"], decode_tool=decode)
    ok(events)
    assert summary(items) == [("call", "get_time", '{"zone": "UTC"}', "completed")]


def test_keys_after_the_arguments_give_the_canonical_arguments() -> None:
    _, items = simulate(['<tool_call>{"name": "f", "arguments": {"a": 1}, "id": "x"}</tool_call>'])
    assert json.loads(items[0]["arguments"]) == {"a": 1}


def test_parsed_deltas_from_a_parser_without_markers() -> None:
    def call(index, name=None, args=None, call_id=None):
        return SimpleNamespace(index=index, id=call_id, function=SimpleNamespace(name=name, arguments=args))

    stream = ResponsesStream(Markers())
    events = []
    events += stream.feed_parsed(reasoning="thinking")
    events += stream.feed_parsed(reasoning=" more")
    events += stream.feed_parsed(content="\n\n")
    events += stream.feed_parsed(content="Text.")
    events += stream.feed_parsed(tool_calls=[call(0, "f", None, "call_a")])
    events += stream.feed_parsed(tool_calls=[call(0, None, '{"x"')])
    events += stream.feed_parsed(tool_calls=[call(0, None, ": 1}"), call(1, "g", "{}", "call_b")])
    events += stream.feed_parsed(content="after")
    events += stream.finish("stop")
    items = [i.model_dump(mode="json") for i in stream.items]
    ok(_wrap(events, items))
    assert summary(items) == [("reasoning", "thinking more", "completed"), ("message", "\n\nText.", "completed"),
                              ("call", "f", '{"x": 1}', "completed"), ("call", "g", "{}", "completed"),
                              ("message", "after", "completed")]
    assert items[2]["call_id"] == "call_a"


def test_logprobs_ride_on_the_text_deltas_of_their_feed() -> None:
    from openai.types.responses.response_output_text import Logprob

    lp = Logprob(token="Hi", logprob=-0.5, top_logprobs=[], bytes=[72, 105])
    stream = ResponsesStream(MARKERS)
    events = stream.feed("<think>x</think>", [lp]) + stream.feed("Hi", [lp]) + stream.finish("stop")
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) == 1 and len(deltas[0].logprobs) == 1
    assert len(stream.items[-1].content[0].logprobs) == 1


def _wrap(events, items):
    from tests.patches.vllm.responses_stream.support import wrap

    return wrap(events, items, "completed")


def test_segmenter_holds_back_only_possible_markers() -> None:
    seg = Segmenter(MARKERS)
    assert seg.feed("a<b") == [("text", "a<b")]
    assert seg.feed("c <th") == [("text", "c ")]
    assert seg.feed("ink>") == []
    assert seg.feed("r") == [("reasoning", "r")]
    assert seg.finish() == []


# --------------------------------------------------------------------------------------------------
# property: any order, any chunking

WORDS = st.sampled_from(["alpha", "beta", "x < y", "a>b", "tool", "think", "{}", "é", "call_"])
SEPARATORS = st.sampled_from(["", "\n", "\n\n", " "])


@st.composite
def blocks(draw):
    kinds = draw(st.lists(st.sampled_from(["reasoning", "text", "tool", "blank_reasoning"]), min_size=1, max_size=6))
    out = []
    for kind in kinds:
        if kind == "tool":
            args = draw(st.dictionaries(st.sampled_from(["a", "b", "city"]), st.one_of(st.integers(), WORDS),
                                        max_size=2))
            out.append(("tool", draw(st.sampled_from(["f", "get_weather"])), args))
        elif kind == "blank_reasoning":
            out.append(("reasoning", draw(st.sampled_from(["", "\n", " \n "]))))
        else:
            out.append((kind, " ".join(draw(st.lists(WORDS, min_size=1, max_size=4)))))
    return out


def render(parts) -> tuple[str, list[tuple]]:
    text, expected = "", []
    pending_text = ""

    def flush():
        nonlocal pending_text
        if pending_text.strip():
            expected.append(("message", pending_text.strip(), "completed"))
        pending_text = ""

    for part in parts:
        sep = "\n"
        if part[0] == "text":
            text += part[1] + sep
            pending_text += part[1] + sep
            continue
        flush()
        if part[0] == "reasoning":
            text += f"<think>{part[1]}</think>{sep}"
            if part[1].strip():
                expected.append(("reasoning", part[1].strip(), "completed"))
        else:
            body = json.dumps({"name": part[1], "arguments": part[2]}, ensure_ascii=False)
            text += f"<tool_call>\n{body}\n</tool_call>{sep}"
            expected.append(("call", part[1], json.dumps(part[2], ensure_ascii=False), "completed"))
    flush()
    return text, expected


@settings(max_examples=150, deadline=None)
@given(parts=blocks(), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=25))
def test_any_order_any_chunking(parts, cuts) -> None:
    text, expected = render(parts)
    points = sorted({c % (len(text) + 1) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)])]
    events, items = simulate(chunks)
    assert check_events(events) == []
    assert summary(items) == expected
