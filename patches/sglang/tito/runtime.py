"""What the tito-patched SGLang chat code calls: token-in/token-out on ``/v1/chat/completions``.

Imported by the patched ``protocol.py`` and ``serving_chat.py`` inside SGLang's API-server process,
so it imports the standard library only and is unit-tested without SGLang.

The contract (docs/tito.md), the same as on vLLM:

- ``input_ids``: the prompt is exactly these ids (no chat template, no tokenization); ``messages``
  may still be sent, for the parsers, but never changes the prompt. With the ``token-ids`` patch
  applied they come back as ``prompt_token_ids`` (``return_token_ids`` defaults to true with them).
- ``logprob_start_len`` (SGLang's own meaning, which upstream hard-codes to -1 on chat): prompt
  logprobs from that position on, as ``prompt_logprobs`` in vLLM's shape; -1 (the default) computes
  none, so prefix caching stays intact. SGLang's first entry is always empty, so the engine is asked
  for one position earlier and position ``k`` itself has its logprob, as on vLLM.
- ``token_id`` on every logprob entry and on each of its ``top_logprobs``.
- ``prefix_token_ids`` (also NeMo-RL's ``required_prefix_token_ids``, or NeMo-Gym's ids on the last
  assistant message): the prompt starts with these ids exactly and continues with what the chat
  template puts after them (``toolkit.patches.common.prefix_splice``).
- ``tokens`` (prime-rl / verifiers' ``/v1/chat/completions/tokens`` body): the same as ``input_ids``.
- ``TOOLKIT_OPENAI_METADATA=1`` (server-wide, off by default): the response's ``metadata`` maps strings
  to strings, as the ``openai`` package's ``ChatCompletion`` types it; SGLang 0.5.19 on puts the
  ``weight_versions`` list there, which clients that validate with that model (verifiers) refuse.

Bad input raises ``ValueError``: in a pydantic validator SGLang turns it into an HTTP 400 through its
request-validation handler; in the serving class, ``handle_request`` answers it with a 400. The request
checks both engines share are ``toolkit.patches.common.tito.validate``; the logprob entries' ids are
set by ``logprob_ids``.
"""

from __future__ import annotations

import functools
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from toolkit.patches.common import prefix_splice
from toolkit.patches.common.env import env_flag
from toolkit.patches.common.serialize import omit_when_none
from toolkit.patches.common.tito import validate
from toolkit.patches.common.tito.validate import is_int
from toolkit.patches.sglang.tito.logprob_ids import (logprob_ids_from_raw, response_logprob_ids,
                                                     set_logprob_token_ids, stream_logprob_ids)

# What the patched engine files call on this module (codemods.py injects ``runtime.<name>``; the
# serializers' omit_when_none and the logprob decorators are re-exported), and the logprob-id rule.
__all__ = ["convert_request", "finish_chat_response", "has_input_ids", "logprob_ids_from_raw", "normalize_request",
           "omit_when_none", "processed_input_ids", "response_logprob_ids", "set_logprob_token_ids",
           "stream_logprob_ids"]

TOKEN_IDS_RUNTIME = "toolkit.patches.sglang.token_ids.runtime"
OPENAI_METADATA_FLAG = "TOOLKIT_OPENAI_METADATA"


def token_ids_patch_loaded() -> bool:
    """Whether the ``token-ids`` patch is applied in this process (its runtime is imported by the
    patched protocol.py before any request is validated)."""
    return TOKEN_IDS_RUNTIME in sys.modules


def has_input_ids(request: Any) -> bool:
    return getattr(request, "input_ids", None) is not None


# --------------------------------------------------------------------------------------------------
# request fields (ChatCompletionRequest's "before" validator)


def _value_error(message: str, field: str) -> Exception:
    return ValueError(message)  # SGLang's 400 carries the message only; the field is named in it


def check_input_ids(ids: Any, field: str = "input_ids") -> list[int]:
    """Type checks that need no engine (``validate.check_input_ids``), as SGLang's ``ValueError``."""
    return validate.check_input_ids(ids, _value_error, field)


def normalize_request(data: Any) -> Any:
    """Check and complete a raw chat request body before pydantic validates its fields.

    With ``input_ids``: ``messages`` becomes optional (``[]``) and, when the ``token-ids`` patch is
    applied, ``return_token_ids`` defaults to true. ``logprob_start_len`` must be -1 or a position,
    and a position is non-streaming only. Raises ``ValueError`` naming the field (HTTP 400).
    """
    if not isinstance(data, dict):
        return data
    prefix_splice.normalize_token_fields(data, check_input_ids, _value_error)
    if data.get("prefix_token_ids") is not None and data.get("return_token_ids") is None \
            and token_ids_patch_loaded():
        data["return_token_ids"] = True
    if data.get("input_ids") is not None:  # its types were checked just above (normalize_token_fields)
        if data.get("messages") is None:
            data["messages"] = []
        if data.get("return_token_ids") is None and token_ids_patch_loaded():
            data["return_token_ids"] = True
    validate.check_logprob_start_len(data, _value_error)
    return data


def processed_input_ids(request: Any, result_class: Callable[..., Any]) -> Any:
    """The prompt of a request with ``input_ids`` in the shape the chat template would have given
    (SGLang's ``MessageProcessingResult``): the ids, and the request's own stop strings."""
    return result_class(
        prompt="",
        prompt_ids=list(request.input_ids),
        image_data=None,
        audio_data=None,
        video_data=None,
        modalities=[],
        stop=request.stop or [],
    )


# --------------------------------------------------------------------------------------------------
# OpenAIServingChat._convert_to_internal_request


def vocab_size(serving: Any) -> int | None:
    """One past the largest valid token id: the model's vocabulary (its embedding rows)."""
    manager = getattr(serving, "tokenizer_manager", None)
    size = getattr(getattr(manager, "model_config", None), "vocab_size", None)
    if is_int(size) and size > 0:
        return size
    tokenizer = getattr(manager, "tokenizer", None)
    if tokenizer is not None:
        try:
            return len(tokenizer)
        except TypeError:
            return None
    return None


def context_length(serving: Any) -> int | None:
    manager = getattr(serving, "tokenizer_manager", None)
    length = getattr(manager, "context_len", None)
    if not is_int(length):
        length = getattr(getattr(manager, "model_config", None), "context_len", None)
    return length if is_int(length) and length > 0 else None


def check_prompt_ids(serving: Any, request: Any) -> None:
    """Checks of ``input_ids`` that need the served model: vocabulary and context length.

    SGLang itself refuses a prompt plus ``max_tokens`` that reaches the context, but only later, in
    the tokenizer manager (a stream would already have answered 200); ids out of the vocabulary it
    does not check at all, and they would fail the model's embedding lookup.
    """
    ids: list[int] = request.input_ids  # list[int]: the request validator checked the types (normalize_request)
    validate.check_in_vocabulary(ids, vocab_size(serving), _value_error, "input_ids")
    check_context(serving, request, len(ids), "`input_ids`")


def check_context(serving: Any, request: Any, length: int, label: str) -> None:
    """The prompt (``label`` names it) plus ``max_tokens`` must stay below the model's context."""
    context = context_length(serving)
    if context is None:
        return
    max_tokens = request.max_completion_tokens or request.max_tokens
    if length >= context:
        raise ValueError(
            f"{label} has {length} tokens, which leaves no room for output in the "
            f"model's context of {context} tokens"
        )
    if max_tokens is not None and length + max_tokens >= context:
        raise ValueError(
            f"{label} has {length} tokens and max_tokens is {max_tokens}: {length + max_tokens} "
            f"reaches the model's context of {context} tokens (the prompt plus max_tokens must stay below it)"
        )


class _TemplateCalls:
    """Records the chat-template calls SGLang makes while it renders one request (the messages as
    SGLang hands them to the template, with its tools and keyword arguments), so the splice renders
    variants of the conversation exactly as SGLang would. ``_convert_to_internal_request`` is
    synchronous: no other request renders while the recorder is in place."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.original = tokenizer.apply_chat_template
        self.own = tokenizer.__dict__.get("apply_chat_template")  # an instance attribute to put back
        self.calls: list[tuple[list, dict]] = []

    def __enter__(self) -> "_TemplateCalls":
        original = self.original

        def recorder(conversation: Any, *args: Any, **kwargs: Any) -> Any:
            result = original(conversation, *args, **kwargs)
            self.calls.append((conversation, kwargs))  # after it rendered: a failed attempt is not kept
            return result

        self.tokenizer.apply_chat_template = recorder
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.own is not None:
            self.tokenizer.apply_chat_template = self.own
        else:
            del self.tokenizer.apply_chat_template

    def template(self) -> prefix_splice.Template:
        conversation, recorded = self.calls[-1]
        tokenizer, original = self.tokenizer, self.original

        def render(messages: list, add_generation_prompt: bool | None) -> str:
            kwargs = {k: v for k, v in recorded.items() if k not in ("tokenize", "return_dict")}
            if add_generation_prompt is not None:
                kwargs.update(add_generation_prompt=add_generation_prompt, continue_final_message=False)
            return original(messages, tokenize=False, return_dict=False, **kwargs)

        encode, decode = prefix_splice.tokenizer_codec(tokenizer)
        return prefix_splice.Template(render=render, encode=encode, decode=decode)


def splice_into(serving: Any, request: Any, adapted_request: Any, calls: _TemplateCalls) -> None:
    """The engine request's prompt becomes ``prefix_token_ids`` exactly, then what the template puts
    after them (``prefix_splice.splice``); a ValueError (HTTP 400) when it cannot be."""
    prefix: list[int] = request.prefix_token_ids  # list[int]: checked by the request validator (normalize_request)
    validate.check_in_vocabulary(prefix, vocab_size(serving), _value_error, "prefix_token_ids")
    if not calls.calls:
        raise ValueError("`prefix_token_ids` needs the server's Jinja chat template (this server renders "
                         "chat prompts another way)")
    if getattr(adapted_request, "image_data", None) or getattr(adapted_request, "audio_data", None) \
            or getattr(adapted_request, "video_data", None):
        raise ValueError("`prefix_token_ids` works with text conversations only (this prompt has media)")
    template = calls.template()
    rendered = getattr(adapted_request, "input_ids", None)
    if rendered is None or isinstance(rendered, str):
        rendered = template.encode(adapted_request.text)
    elif rendered and isinstance(rendered[0], list):
        rendered = rendered[0]
    rendered = list(rendered)
    if rendered[: len(prefix)] != prefix:
        messages = calls.calls[-1][0]
        try:
            rendered = prefix_splice.splice(prefix, rendered, template.decode(rendered), messages, template).prompt
        except prefix_splice.SpliceError as error:
            raise ValueError(str(error)) from None
    check_context(serving, request, len(rendered), "the spliced prompt (`prefix_token_ids` and the new turn)")
    adapted_request.input_ids = rendered
    if getattr(adapted_request, "text", None) is not None:
        adapted_request.text = None


def _prompt_length(adapted_request: Any) -> int | None:
    ids = getattr(adapted_request, "input_ids", None)
    if ids is None or isinstance(ids, str):
        return None
    if ids and isinstance(ids[0], (list, tuple)):
        ids = ids[0]
    return len(ids)


def logprob_start(request: Any) -> int:
    start = getattr(request, "logprob_start_len", None)
    return -1 if start is None else start


def convert_request(method: Callable) -> Callable:
    """Decorate ``OpenAIServingChat._convert_to_internal_request(self, request, raw_request)``.

    Before: ``input_ids`` are checked against the served model. After: the engine request's prompt
    is exactly ``input_ids`` (a copy: SGLang edits prompts in place), or the templated prompt with
    ``prefix_token_ids`` spliced in, and ``logprob_start_len`` replaces upstream's hard-coded -1,
    with logprobs computed when it asks for prompt logprobs.
    """

    @functools.wraps(method)
    def convert(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        with_ids = has_input_ids(request)
        if with_ids:
            check_prompt_ids(self, request)
        if getattr(request, "prefix_token_ids", None) is not None and not with_ids:
            with _TemplateCalls(self.tokenizer_manager.tokenizer) as calls:
                adapted_request, processed_request = method(self, request, *args, **kwargs)
            splice_into(self, request, adapted_request, calls)
        else:
            adapted_request, processed_request = method(self, request, *args, **kwargs)
        if with_ids:
            adapted_request.input_ids = list(request.input_ids)
            if getattr(adapted_request, "text", None) is not None:
                adapted_request.text = None
        start = logprob_start(request)
        if start >= 0:
            length = _prompt_length(adapted_request)
            if length is not None:
                validate.check_logprob_start_in_prompt(start, length, _value_error)
            adapted_request.logprob_start_len = engine_logprob_start(start)
            adapted_request.return_logprob = True
        return adapted_request, processed_request

    return convert


# --------------------------------------------------------------------------------------------------
# the response


def engine_logprob_start(start: int) -> int:
    """Where SGLang must start for prompt logprobs from ``start`` on: its first entry is always empty
    (it has no logits before the start), so it is asked for one position earlier."""
    return max(start - 1, 0) if start >= 0 else -1


def prompt_logprobs(meta_info: dict, start: int, prompt_length: int, prompt: Sequence[int] | None = None) -> list | None:
    """SGLang's ``input_token_logprobs`` (``(logprob, id, text)`` from ``engine_logprob_start(start)``
    on) in vLLM's ``prompt_logprobs`` shape: one entry per prompt id, ``None`` before ``start`` and
    where the engine has no logprob (position 0); each entry maps ``str(id)`` to ``{"logprob",
    "decoded_token"}``, the prompt token first, then the ``top_logprobs`` SGLang computed there.

    ``prompt`` (the ids sent, when known) names the prompt tokens: SGLang reports the id
    ``vocab_size - 1`` as 0 in these triples.
    """
    tokens = meta_info.get("input_token_logprobs")
    if tokens is None:
        return None
    tops = meta_info.get("input_top_logprobs") or []
    first = engine_logprob_start(start)
    entries: list[dict | None] = [None] * first
    for offset, item in enumerate(tokens):
        position = first + offset
        logprob, token_id, text = _triple(item)
        if prompt is not None and position < len(prompt):
            token_id = int(prompt[position])
        if logprob is None or position < start:
            entries.append(None)
            continue
        entry = {str(token_id): {"logprob": logprob, "decoded_token": text}}
        row = tops[offset] if offset < len(tops) else None
        for top in row or ():
            top_logprob, top_id, top_text = _triple(top)
            entry.setdefault(str(top_id), {"logprob": top_logprob, "decoded_token": top_text})
        entries.append(entry)
    if len(entries) < prompt_length:
        entries.extend([None] * (prompt_length - len(entries)))
    return entries[:prompt_length] if prompt_length else entries


def _triple(item: Sequence[Any]) -> tuple[Any, int, Any]:
    logprob, token_id = item[0], int(item[1])
    text = item[2] if len(item) > 2 else None
    return logprob, token_id, text


def string_metadata(metadata: Any) -> Any:
    """``metadata`` with every value that is not a string as compact JSON (SGLang's
    ``weight_versions`` list becomes ``'[{"version":"default","start":0,"end":5}]'``); anything but a
    dict, or a dict of strings, comes back as it is."""
    if not isinstance(metadata, dict) or all(isinstance(value, str) for value in metadata.values()):
        return metadata
    return {key: value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))
            for key, value in metadata.items()}


def finish_chat_response(method: Callable) -> Callable:
    """Decorate ``OpenAIServingChat._build_chat_response(self, request, ret, created)``: the prompt
    logprobs a ``logprob_start_len`` asked for go on the response as ``prompt_logprobs``; with
    ``TOOLKIT_OPENAI_METADATA`` on, ``metadata`` holds strings only (:func:`string_metadata`)."""

    @functools.wraps(method)
    def build(self: Any, request: Any, ret: list, *args: Any, **kwargs: Any) -> Any:
        response = method(self, request, ret, *args, **kwargs)
        if env_flag(OPENAI_METADATA_FLAG) and getattr(response, "metadata", None) is not None:
            response.metadata = string_metadata(response.metadata)
        start = logprob_start(request)
        if start < 0 or not hasattr(response, "choices") or not ret:
            return response
        meta_info = ret[0].get("meta_info") or {}
        prompt = request.input_ids if has_input_ids(request) else None
        length = meta_info.get("prompt_tokens")
        if not is_int(length):
            length = engine_logprob_start(start) + len(meta_info.get("input_token_logprobs") or ())
        response.prompt_logprobs = prompt_logprobs(meta_info, start, length, prompt)
        return response

    return build
