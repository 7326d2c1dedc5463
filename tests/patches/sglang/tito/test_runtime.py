"""The SGLang tito runtime without SGLang: request checks, prompt checks, logprob ids, prompt logprobs,
and a hypothesis fuzz of the request body (every body is accepted or refused with a ValueError, the
400 SGLang answers; nothing else escapes)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.patches.sglang.tito import runtime

# --------------------------------------------------------------------------------------------------
# normalize_request


def test_input_ids_make_messages_optional():
    data = runtime.normalize_request({"model": "m", "input_ids": [1, 2, 3]})
    assert data["messages"] == []


def test_return_token_ids_defaults_to_true_only_where_token_ids_is_applied(monkeypatch):
    monkeypatch.delitem(sys.modules, runtime.TOKEN_IDS_RUNTIME, raising=False)
    assert "return_token_ids" not in runtime.normalize_request({"input_ids": [1]})
    monkeypatch.setitem(sys.modules, runtime.TOKEN_IDS_RUNTIME, SimpleNamespace())
    assert runtime.normalize_request({"input_ids": [1]})["return_token_ids"] is True
    assert runtime.normalize_request({"input_ids": [1], "return_token_ids": False})["return_token_ids"] is False
    assert "return_token_ids" not in runtime.normalize_request({"messages": []})  # no input_ids: untouched


def test_request_without_tito_fields_is_untouched():
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    assert runtime.normalize_request(dict(body)) == body
    assert runtime.normalize_request("not a dict") == "not a dict"


@pytest.mark.parametrize("ids,message", [
    ("1 2", "`input_ids` must be a list of integer token ids, got str"),
    ([], "`input_ids` must not be empty"),
    ([1, "2"], "item 1 is str '2'"),
    ([2.0], "item 0 is float 2.0"),
    ([True], "item 0 is bool True"),
    ([5, -1], "`input_ids` must not contain negative ids: item 1 is -1"),
])
def test_bad_input_ids_name_the_field_and_the_item(ids, message):
    with pytest.raises(ValueError, match="`input_ids`") as error:
        runtime.normalize_request({"input_ids": ids})
    assert message in str(error.value)


@pytest.mark.parametrize("body,message", [
    ({"logprob_start_len": "3"}, "`logprob_start_len` must be an integer, got str '3'"),
    ({"logprob_start_len": -2}, "got -2"),
    ({"logprob_start_len": 0, "stream": True}, "not available with `stream=true`"),
])
def test_bad_logprob_start_len_names_the_field(body, message):
    with pytest.raises(ValueError) as error:
        runtime.normalize_request({"messages": [], **body})
    assert message in str(error.value) and "`logprob_start_len`" in str(error.value)


def test_logprob_start_len_minus_one_streams():
    assert runtime.normalize_request({"messages": [], "logprob_start_len": -1, "stream": True})


# --------------------------------------------------------------------------------------------------
# convert_request


@dataclass
class Adapted:
    input_ids: Any = None
    text: str | None = None
    logprob_start_len: int = -1
    return_logprob: bool = False


@dataclass
class Request:
    input_ids: list[int] | None = None
    logprob_start_len: int | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    messages: list = field(default_factory=list)


class Serving:
    def __init__(self, vocab: int = 100, context: int = 50, prompt: Any = None) -> None:
        self.tokenizer_manager = SimpleNamespace(model_config=SimpleNamespace(vocab_size=vocab), context_len=context)
        self.prompt = prompt or [1, 2, 3, 4]

    @runtime.convert_request
    def convert(self, request, raw_request=None):
        return Adapted(input_ids=list(self.prompt) if request.input_ids is None else [0]), request


def test_the_engine_prompt_is_a_copy_of_input_ids_and_text_goes():
    ids = [7, 8, 9]
    serving = Serving()
    serving.prompt = "text prompt"
    adapted, _ = serving.convert(Request(input_ids=ids))
    assert adapted.input_ids == ids and adapted.input_ids is not ids and adapted.text is None


def test_logprob_start_len_turns_logprobs_on_and_is_checked_against_the_prompt():
    adapted, _ = Serving().convert(Request(logprob_start_len=3))
    assert adapted.logprob_start_len == 2 and adapted.return_logprob is True  # SGLang's first entry is empty
    adapted, _ = Serving().convert(Request(logprob_start_len=-1))
    assert adapted.logprob_start_len == -1 and adapted.return_logprob is False
    with pytest.raises(ValueError, match=r"`logprob_start_len` is 4, but the prompt has only 4 tokens"):
        Serving().convert(Request(logprob_start_len=4))


@pytest.mark.parametrize("request_,message", [
    (Request(input_ids=[5, 100]), "`input_ids` item 1 is 100, out of the vocabulary (ids must be < 100)"),
    (Request(input_ids=[1] * 50), "`input_ids` has 50 tokens, which leaves no room for output"),
    (Request(input_ids=[1] * 40, max_tokens=10), "`input_ids` has 40 tokens and max_tokens is 10: 50 reaches"),
    (Request(input_ids=[1] * 40, max_completion_tokens=10), "max_tokens is 10"),
])
def test_prompt_checks_against_the_model(request_, message):
    with pytest.raises(ValueError) as error:
        Serving().convert(request_)
    assert message in str(error.value)


def test_a_prompt_that_fits_passes():
    adapted, _ = Serving().convert(Request(input_ids=[1] * 40, max_tokens=9))
    assert adapted.input_ids == [1] * 40


# --------------------------------------------------------------------------------------------------
# logprob ids and prompt logprobs


@dataclass
class Entry:
    token: str
    logprob: float = 0.0
    top_logprobs: list = field(default_factory=list)
    token_id: int | None = None


def test_logprob_entries_get_ids_positionally():
    raw = [(-0.1, 11, "a"), (-0.2, 12, "b")]
    tops = [[(-0.1, 11, "a"), (-0.5, 13, "c")], [(-0.2, 12, "b"), (-0.3, 14, "d")]]
    entries = [Entry("a", top_logprobs=[Entry("a"), Entry("c")]), Entry("b", top_logprobs=[Entry("b"), Entry("d")])]
    runtime.set_logprob_token_ids(entries, raw, tops)
    assert [e.token_id for e in entries] == [11, 12]
    assert [[t.token_id for t in e.top_logprobs] for e in entries] == [[11, 13], [12, 14]]


def test_top_entries_collapsed_by_text_get_the_id_that_kept_its_logprob():
    # two ids with one text: 0.5.9's dict keeps the first position and the later logprob
    raw = [(-0.1, 11, "a")]
    tops = [[(-0.1, 11, "a"), (-0.5, 21, "x"), (-0.7, 22, "x")]]
    entries = [Entry("a", top_logprobs=[Entry("a", -0.1), Entry("x", -0.7)])]
    runtime.set_logprob_token_ids(entries, raw, tops)
    assert [t.token_id for t in entries[0].top_logprobs] == [11, 22]


def test_prompt_logprobs_in_vllm_shape():
    # asked for 2 on, the engine started at 1: its first entry (always empty) is dropped
    meta = {"input_token_logprobs": [(None, 20, "b"), (-1.5, 30, "c"), (-2.5, 0, "d")],
            "input_top_logprobs": [None, [(-1.0, 31, "e"), (-1.5, 30, "c")], None]}
    assert runtime.prompt_logprobs(meta, 2, 4, prompt=[10, 20, 30, 4095]) == [
        None, None,
        {"30": {"logprob": -1.5, "decoded_token": "c"}, "31": {"logprob": -1.0, "decoded_token": "e"}},
        {"4095": {"logprob": -2.5, "decoded_token": "d"}},  # SGLang reports the last id as 0
    ]
    assert runtime.prompt_logprobs({"input_token_logprobs": [(None, 1, "a"), (-0.5, 2, "b")]}, 0, 2) == [
        None, {"2": {"logprob": -0.5, "decoded_token": "b"}}]
    assert runtime.prompt_logprobs({}, 0, 2) is None
    assert [runtime.engine_logprob_start(k) for k in (-1, 0, 1, 5)] == [-1, 0, 0, 4]


def test_omit_when_none_drops_only_none_fields():
    class Model:
        prompt_logprobs = None
        other = None

        @runtime.omit_when_none("prompt_logprobs")
        def serialize(self, handler):
            return {"prompt_logprobs": None, "other": None}

    assert Model().serialize(None) == {"other": None}


def test_metadata_becomes_strings_only_with_the_switch(monkeypatch):
    spans = [{"version": "default", "start": 0, "end": 5}]

    def build(self, request, ret, created):  # SGLang 0.5.23's metadata, a list among strings
        return SimpleNamespace(metadata={"weight_version": "default", "weight_versions": spans})

    finish = runtime.finish_chat_response(build)
    request = SimpleNamespace(logprob_start_len=None)
    monkeypatch.delenv("TOOLKIT_OPENAI_METADATA", raising=False)
    assert finish(None, request, [{}], 0).metadata["weight_versions"] == spans  # upstream's answer
    monkeypatch.setenv("TOOLKIT_OPENAI_METADATA", "1")
    assert finish(None, request, [{}], 0).metadata == {
        "weight_version": "default", "weight_versions": '[{"version":"default","start":0,"end":5}]'}
    assert runtime.string_metadata({"weight_version": "v2"}) == {"weight_version": "v2"}
    assert runtime.string_metadata(None) is None


# --------------------------------------------------------------------------------------------------
# fuzz: any JSON-ish body is accepted or refused with a ValueError naming a tito field

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=8,
)
bodies = st.fixed_dictionaries({}, optional={
    "input_ids": json_values | st.lists(st.integers(-3, 5000), max_size=6),
    "logprob_start_len": json_values | st.integers(-3, 10),
    "messages": json_values,
    "stream": json_values,
    "return_token_ids": json_values,
    "max_tokens": json_values | st.integers(0, 100),
})


@settings(max_examples=300, deadline=None)
@given(bodies)
def test_fuzzed_bodies_are_accepted_or_refused_naming_the_field(body):
    try:
        data = runtime.normalize_request(dict(body))
    except ValueError as error:
        assert "`input_ids`" in str(error) or "`logprob_start_len`" in str(error)
        return
    if body.get("input_ids") is not None:
        ids = data["input_ids"]
        assert ids and all(type(i) is int and i >= 0 for i in ids)
        request = Request(input_ids=ids, max_tokens=data.get("max_tokens") if type(data.get("max_tokens")) is int
                          else None)
        try:
            Serving(vocab=4096, context=4096).convert(request)
        except ValueError as error:
            assert "`input_ids`" in str(error)
