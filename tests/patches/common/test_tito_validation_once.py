"""One type check of the prompt ids per tito request, on both engines (issue 52): a request body is
checked once, by the "before" validator the patch adds to the engine's request model
(``normalize_request``), and the later steps the patched serving code calls (vLLM's
``prompt_ids_from_request`` and ``check_prompt``, SGLang's ``convert_request``) read the model's
``list[int]`` fields without checking their types again.

The request models here are pydantic models built as the codemods build the engines' (the fields and
``@model_validator(mode="before")`` handing the raw body to the runtime); the runtime functions are
the real ones.
"""

from __future__ import annotations

from typing import Any, Optional

import pytest
from pydantic import BaseModel, model_validator

from toolkit.patches.common.tito import validate
from toolkit.patches.sglang.tito import runtime as sglang_runtime
from toolkit.patches.vllm.tito import runtime as vllm_runtime

from tests.patches.sglang.tito.test_runtime import Serving
from tests.patches.vllm.tito.test_runtime import FakeRenderer


class VllmChatRequest(BaseModel):
    messages: list = []
    input_ids: Optional[list[int]] = None
    prefix_token_ids: Optional[list[int]] = None
    logprob_start_len: Optional[int] = None
    return_token_ids: Optional[bool] = None
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None
    kv_transfer_params: Optional[dict] = None

    @model_validator(mode="before")
    @classmethod
    def _toolkit_tito_request(cls, data: Any) -> Any:
        return vllm_runtime.normalize_request(data)


class VllmResponsesRequest(BaseModel):
    input: Any = None
    input_ids: Optional[list[int]] = None
    return_token_ids: Optional[bool] = None
    max_output_tokens: Optional[int] = None
    kv_transfer_params: Optional[dict] = None

    @model_validator(mode="before")
    @classmethod
    def _toolkit_tito_responses_request(cls, data: Any) -> Any:
        return vllm_runtime.normalize_responses_request(data)


class SglangChatRequest(BaseModel):
    messages: list = []
    input_ids: Optional[list[int]] = None
    prefix_token_ids: Optional[list[int]] = None
    logprob_start_len: Optional[int] = None
    return_token_ids: Optional[bool] = None
    max_tokens: Optional[int] = None
    max_completion_tokens: Optional[int] = None

    @model_validator(mode="before")
    @classmethod
    def _toolkit_tito_request(cls, data: Any) -> Any:
        return sglang_runtime.normalize_request(data)


@pytest.fixture
def checks(monkeypatch) -> list[str]:
    """The field of every type check of a list of ids, in order (the one shared check, counted)."""
    seen: list[str] = []
    real = validate.check_input_ids

    def counted(ids: Any, error: Any, field: str = "input_ids") -> list[int]:
        seen.append(field)
        return real(ids, error, field)

    monkeypatch.setattr(validate, "check_input_ids", counted)
    return seen


@pytest.mark.parametrize("body,field", [({"input_ids": [1, 2, 3]}, "input_ids"), ({"tokens": [1, 2, 3]}, "tokens")])
def test_vllm_chat_with_ids_checks_them_once(checks, body, field):
    request = VllmChatRequest.model_validate(dict(body))  # a copy: the validator completes the body in place
    assert vllm_runtime.prompt_ids_from_request(request, FakeRenderer()) == [1, 2, 3]
    vllm_runtime.check_prompt(request, [{"type": "token", "prompt_token_ids": [1, 2, 3]}], max_model_len=100)
    assert checks == [field]


def test_vllm_responses_with_ids_checks_them_once(checks):
    request = VllmResponsesRequest.model_validate({"input_ids": [4, 5]})
    assert vllm_runtime.prompt_ids_from_request(request, FakeRenderer()) == [4, 5]
    assert checks == ["input_ids"]


def test_vllm_prefix_is_checked_once(checks):
    request = VllmChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "prefix_token_ids": [1]})
    assert vllm_runtime.prompt_ids_from_request(request, FakeRenderer()) is None
    assert checks == ["prefix_token_ids"]


@pytest.mark.parametrize("body,field", [({"input_ids": [1, 2, 3]}, "input_ids"), ({"tokens": [1, 2, 3]}, "tokens")])
def test_sglang_chat_with_ids_checks_them_once(checks, body, field):
    request = SglangChatRequest.model_validate(dict(body))
    adapted, _ = Serving().convert(request)
    assert adapted.input_ids == [1, 2, 3]  # through every check, the vocabulary and the context included
    assert checks == [field]


@pytest.mark.parametrize("engine_runtime,model", [(vllm_runtime, VllmChatRequest), (sglang_runtime, SglangChatRequest)])
def test_a_bad_id_is_refused_by_that_one_check(checks, engine_runtime, model):
    with pytest.raises(ValueError, match="`input_ids` must contain only integers: item 1 is str"):
        model.model_validate({"input_ids": [1, "2"]})
    assert checks == ["input_ids"]


def test_out_of_vocabulary_is_one_message_on_both_engines():
    vllm_request = VllmChatRequest.model_validate({"input_ids": [5, 100]})
    with pytest.raises(ValueError) as vllm_error:
        vllm_runtime.prompt_ids_from_request(vllm_request, FakeRenderer())
    with pytest.raises(ValueError) as sglang_error:
        Serving(vocab=100).convert(SglangChatRequest.model_validate({"input_ids": [5, 100]}))
    expected = "`input_ids` item 1 is 100, out of the vocabulary (ids must be < 100)"
    assert str(sglang_error.value) == expected and expected in str(vllm_error.value)
