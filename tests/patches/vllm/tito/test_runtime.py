"""The tito runtime without vLLM: request checks, prompt checks and response rewrites."""

from __future__ import annotations

import contextlib

from dataclasses import dataclass, field
from typing import Any

import pytest

from toolkit.patches.vllm.tito import runtime



@contextlib.contextmanager
def raises_400(parameter: str):
    """The runtime's bad-request error (TitoValidationError without vLLM) naming ``parameter``."""
    with pytest.raises(runtime.TitoValidationError) as info:
        yield info
    assert info.value.parameter == parameter
    assert f"`{parameter}`" in str(info.value)


# --------------------------------------------------------------------------------------------------
# normalize_request


def test_input_ids_make_messages_optional_and_ids_returned():
    data = runtime.normalize_request({"model": "m", "input_ids": [1, 2, 3]})
    assert data["messages"] == []
    assert data["return_token_ids"] is True
    assert data["add_generation_prompt"] is True and data["continue_final_message"] is False


def test_input_ids_keep_messages_and_explicit_return_token_ids_false():
    messages = [{"role": "user", "content": "hi"}]
    data = runtime.normalize_request(
        {"messages": messages, "input_ids": [5], "return_token_ids": False, "add_generation_prompt": False}
    )
    assert data["messages"] is messages
    assert data["return_token_ids"] is False
    assert data["add_generation_prompt"] is False  # messages present: template switches untouched


def test_request_without_input_ids_is_untouched(monkeypatch):
    monkeypatch.delenv(runtime.ENV_RETURN_TOKEN_IDS, raising=False)
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    assert runtime.normalize_request(dict(body)) == body
    assert runtime.normalize_request("not a dict") == "not a dict"


@pytest.mark.parametrize("value,expected", [("1", True), ("true", True), ("0", None), ("", None)])
def test_env_turns_return_token_ids_on_server_wide(monkeypatch, value, expected):
    monkeypatch.setenv(runtime.ENV_RETURN_TOKEN_IDS, value)
    data = runtime.normalize_request({"messages": []})
    assert data.get("return_token_ids") is expected
    # an explicit choice of the client stays
    assert runtime.normalize_request({"messages": [], "return_token_ids": False})["return_token_ids"] is False


@pytest.mark.parametrize(
    "ids,reason",
    [
        ("1 2 3", "must be a list"),
        ({"a": 1}, "must be a list"),
        ([], "must not be empty"),
        ([1, "2"], "item 1 is str"),
        ([1, 2.0], "item 1 is float"),
        ([True], "item 0 is bool"),
        ([None], "item 0 is NoneType"),
        ([[1]], "item 0 is list"),
        ([3, -1], "negative ids: item 1 is -1"),
    ],
)
def test_bad_input_ids_name_field_and_reason(ids, reason):
    with raises_400("input_ids") as info:
        runtime.normalize_request({"input_ids": ids})
    assert reason in str(info.value)


def test_input_ids_with_truncation_rejected():
    with raises_400("truncate_prompt_tokens"):
        runtime.normalize_request({"input_ids": [1], "truncate_prompt_tokens": 4})


@pytest.mark.parametrize(
    "body,reason",
    [
        ({"logprob_start_len": "3"}, "must be an integer"),
        ({"logprob_start_len": 1.5}, "must be an integer"),
        ({"logprob_start_len": True}, "must be an integer"),
        ({"logprob_start_len": -2}, "must be -1"),
        ({"logprob_start_len": 0, "stream": True}, "stream"),
        ({"logprob_start_len": 0, "use_beam_search": True}, "beam search"),
    ],
)
def test_bad_logprob_start_len(body, reason):
    with raises_400("logprob_start_len") as info:
        runtime.normalize_request(body)
    assert reason in str(info.value)


def test_logprob_start_len_turns_prompt_logprobs_on():
    assert runtime.normalize_request({"logprob_start_len": 2})["prompt_logprobs"] == 0
    assert runtime.normalize_request({"logprob_start_len": 2, "logprobs": True, "top_logprobs": 3})["prompt_logprobs"] == 3
    assert runtime.normalize_request({"logprob_start_len": 2, "prompt_logprobs": 5})["prompt_logprobs"] == 5
    assert "prompt_logprobs" not in runtime.normalize_request({"logprob_start_len": -1})
    assert runtime.normalize_request({"logprob_start_len": -1, "stream": True})["logprob_start_len"] == -1


# --------------------------------------------------------------------------------------------------
# the prompt


class FakeRequest:
    model_fields = {"input_ids": None, "logprob_start_len": None}

    def __init__(self, **values: Any) -> None:
        self.input_ids = None
        self.logprob_start_len = None
        self.max_tokens = None
        self.max_completion_tokens = None
        self.kv_transfer_params = None
        self.__dict__.update(values)


class OtherRequest:  # a request type without the field (e.g. a Responses request with extras)
    model_fields = {"input": None}
    input_ids = [1, 2]


@dataclass
class FakeTokenizer:
    max_token_id: int


@dataclass
class FakeModelConfig:
    vocab: int

    def get_vocab_size(self) -> int:
        return self.vocab


@dataclass
class FakeRenderer:
    tokenizer: Any = field(default_factory=lambda: FakeTokenizer(99))
    model_config: Any = field(default_factory=lambda: FakeModelConfig(100))


def test_prompt_ids_from_request():
    renderer = FakeRenderer()
    assert runtime.prompt_ids_from_request(FakeRequest(input_ids=[0, 99]), renderer) == [0, 99]
    assert runtime.prompt_ids_from_request(FakeRequest(), renderer) is None
    assert runtime.prompt_ids_from_request(OtherRequest(), renderer) is None


def test_input_ids_win_over_forwarded_ids():
    request = FakeRequest(input_ids=[7], kv_transfer_params={"prompt_token_ids": [1, 2], "x": 1})
    assert runtime.prompt_ids_from_request(request, FakeRenderer()) == [7]
    assert request.kv_transfer_params == {"x": 1}


def test_vocab_limit_is_the_larger_of_tokenizer_and_model():
    assert runtime.vocab_limit(FakeRenderer(FakeTokenizer(120), FakeModelConfig(100))) == 121
    assert runtime.vocab_limit(FakeRenderer(FakeTokenizer(50), FakeModelConfig(100))) == 100
    with raises_400("input_ids") as info:
        runtime.prompt_ids_from_request(FakeRequest(input_ids=[1, 100]), FakeRenderer())
    assert "item 1 is 100" in str(info.value) and "< 100" in str(info.value)


def engine_inputs(n: int) -> list[dict]:
    return [{"type": "token", "prompt_token_ids": list(range(n))}]


def test_prompt_must_leave_room_for_max_tokens():
    runtime.check_prompt(FakeRequest(input_ids=[1] * 10, max_tokens=6), engine_inputs(10), 16)
    runtime.check_prompt(FakeRequest(input_ids=[1] * 15), engine_inputs(15), 16)
    with raises_400("input_ids") as info:
        runtime.check_prompt(FakeRequest(input_ids=[1] * 10, max_tokens=7), engine_inputs(10), 16)
    assert "17 exceeds the model's context of 16" in str(info.value)
    with raises_400("input_ids"):
        runtime.check_prompt(FakeRequest(input_ids=[1] * 10, max_tokens=1, max_completion_tokens=7), engine_inputs(10), 16)
    with raises_400("input_ids") as info:
        runtime.check_prompt(FakeRequest(input_ids=[1] * 16), engine_inputs(16), 16)
    assert "no room for output" in str(info.value)


def test_messages_prompt_length_is_left_to_vllm():
    runtime.check_prompt(FakeRequest(max_tokens=100), engine_inputs(10), 16)


def test_logprob_start_len_must_be_inside_the_prompt():
    runtime.check_prompt(FakeRequest(logprob_start_len=9), engine_inputs(10), 64)
    runtime.check_prompt(FakeRequest(logprob_start_len=-1), engine_inputs(10), 64)
    with raises_400("logprob_start_len") as info:
        runtime.check_prompt(FakeRequest(logprob_start_len=10), engine_inputs(10), 64)
    assert "only 10 tokens" in str(info.value)


# --------------------------------------------------------------------------------------------------
# the response


def test_prompt_logprobs_before_start_become_none():
    full = [None, {1: "a"}, {2: "b"}, {3: "c"}]
    assert runtime.prompt_logprobs_from(FakeRequest(logprob_start_len=2), full) == [None, None, {2: "b"}, {3: "c"}]
    assert runtime.prompt_logprobs_from(FakeRequest(logprob_start_len=0), full) is full
    assert runtime.prompt_logprobs_from(FakeRequest(), full) is full
    assert runtime.prompt_logprobs_from(FakeRequest(logprob_start_len=2), None) is None


@dataclass
class Entry:
    token: str
    top_logprobs: list = field(default_factory=list)
    token_id: int | None = None


@dataclass
class Logprobs:
    content: list


def test_logprob_entries_get_their_ids():
    steps = [{10: "x", 11: "y", 12: "z"}, None, {30: "p", 31: "q"}]
    content = [Entry("a", [Entry("a"), Entry("b")]), Entry("c"), Entry("d", [Entry("d"), Entry("e")])]
    result = runtime.with_logprob_token_ids(Logprobs(content), [10, 20, 30], steps)
    assert [e.token_id for e in result.content] == [10, 20, 30]
    assert [t.token_id for t in result.content[0].top_logprobs] == [10, 11]
    assert [t.token_id for t in result.content[2].top_logprobs] == [30, 31]


# --------------------------------------------------------------------------------------------------
# the Responses API


def test_responses_input_ids_make_input_optional_and_ids_returned(monkeypatch):
    monkeypatch.delenv(runtime.ENV_RETURN_TOKEN_IDS, raising=False)
    assert runtime.normalize_responses_request({"input_ids": [4, 5]}) == {
        "input_ids": [4, 5], "input": "", "return_token_ids": True}
    assert runtime.normalize_responses_request({"input": "hi"}) == {"input": "hi"}
    monkeypatch.setenv(runtime.ENV_RETURN_TOKEN_IDS, "1")
    assert runtime.normalize_responses_request({"input": "hi"})["return_token_ids"] is True
    assert runtime.normalize_responses_request({"input": "hi", "return_token_ids": False})["return_token_ids"] is False


@pytest.mark.parametrize("field", ["previous_response_id", "previous_input_messages"])
def test_responses_input_ids_refuse_history_from_elsewhere(field):
    with raises_400(field):
        runtime.normalize_responses_request({"input_ids": [1], field: "resp_1" if "id" in field else [{}]})
    with raises_400("input_ids"):
        runtime.normalize_responses_request({"input_ids": [1, -1]})


@dataclass
class Raw:  # vLLM's ResponseRawMessageAndToken
    tokens: list[int]


@dataclass
class Ctx:
    input_messages: list
    output_messages: list


def test_response_ids_come_from_vllms_message_records():
    request = type("R", (), {"return_token_ids": True})()
    response = type("Resp", (), {})()
    runtime.with_response_token_ids(request, response, Ctx([Raw([1, 2])], [Raw([7]), Raw([8, 9])]))
    assert (response.prompt_token_ids, response.token_ids) == ([1, 2], [7, 8, 9])
    harmony = type("Resp", (), {})()  # Harmony's records are messages, not ids: nothing is added
    runtime.with_response_token_ids(request, harmony, Ctx([{"role": "user"}], []))
    assert not hasattr(harmony, "prompt_token_ids")
    off = type("Resp", (), {})()
    runtime.with_response_token_ids(type("R", (), {"return_token_ids": False})(), off, Ctx([Raw([1])], []))
    assert not hasattr(off, "token_ids")


# A vocabulary like the tiny model's: <tool_call> 4092, </tool_call> 4093, </think> 4095 are one id each,
# and the same markers may be spelled by several ids (what a grammar makes a random model do).
VOCAB = {3: "", 10: "a", 11: "b", 20: "x", 21: "y", 30: "{}", 202: "\n", 4092: "<tool_call>", 4093: "</tool_call>",
         4095: "</think>", 50: "<tool", 51: "_call>", 52: "</", 53: "think>"}
MARKERS = runtime.ItemMarkers(lambda ids: "".join(VOCAB[i] for i in ids), "</think>", "<tool_call>", "</tool_call>",
                              trailing=[3])


@pytest.mark.parametrize("ids,has_reasoning,expected", [
    # reasoning then text, end of turn after: </think> closes the reasoning run, the EOS is no item's
    ([10, 11, 4095, 20, 21, 3], True, {"reasoning": [10, 11, 4095], "message": [20, 21], "calls": []}),
    # the same with </think> spelled by two ids
    ([10, 52, 53, 20, 3], True, {"reasoning": [10, 52, 53], "message": [20], "calls": []}),
    # reasoning cut by max tokens: every id is reasoning
    ([10, 11, 10], True, {"reasoning": [10, 11, 10], "message": [], "calls": []}),
    # text, then two calls with a newline between them: the newline and the EOS are no item's
    ([20, 4092, 30, 4093, 202, 50, 51, 30, 4093, 3], False,
     {"reasoning": None, "message": [20], "calls": [[4092, 30, 4093], [50, 51, 30, 4093]]}),
    # reasoning that never ends (as vLLM's non-streaming qwen3 parse reads text before a call): up to the call
    ([10, 4092, 30, 4093, 3], True, {"reasoning": [10], "message": [], "calls": [[4092, 30, 4093]]}),
    # a call cut short: to the last id
    ([4092, 30, 30], False, {"reasoning": None, "message": [], "calls": [[4092, 30, 30]]}),
    # reasoning hidden (no reasoning item): its ids are no item's, the message starts after </think>
    ([10, 4095, 20, 3], False, {"reasoning": None, "message": [20], "calls": []}),
])
def test_split_item_ids(ids, has_reasoning, expected):
    assert runtime.split_item_ids(ids, MARKERS, has_reasoning) == expected


def test_items_without_known_call_markers_get_no_message_or_call_ids():
    """A request with tools whose parser has no call markers: the reasoning run is still known, the
    message's and the calls' are not (the call text could be anywhere after the reasoning)."""
    class Tokenizer:
        all_special_ids = [3]

        def decode(self, ids, skip_special_tokens=True):
            return MARKERS.decode(ids)

    parser = type("P", (), {"reasoning_parser": type("Q", (), {"end_token": "</think>"})(), "tool_parser": object()})()
    context = type("C", (), {"response_parser": parser, "output_messages": [type("M", (), {"tokens": [10, 4095, 20, 30, 3]})()]})()
    output = [{"type": "reasoning"}, {"type": "message"}, {"type": "function_call"}]
    for tools, expected in (([{"type": "function"}], [[10, 4095], None, None]), ([], [[10, 4095], [20, 30], None])):
        request = type("R", (), {"return_token_ids": True, "tools": tools})()
        items = runtime.with_output_item_token_ids(request, [dict(item) for item in output], context, Tokenizer())
        assert [item.get("token_ids") for item in items] == expected
