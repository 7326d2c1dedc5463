"""What the tito-patched vLLM code calls: token-in/token-out on ``/v1/chat/completions`` (and
``/v1/responses``).

Imported by the patched engine files (protocol.py, serving.py, online_renderer.py, and the
Responses API's protocol.py and serving.py) inside the API-server process. Everything here is plain
Python over dicts, lists and duck-typed request and response objects, so it is unit-tested without
vLLM; the one vLLM name used, the validation error that the server turns into an HTTP 400, is
imported lazily. The request checks both engines share are ``toolkit.patches.common.tito.validate``.

The contract (docs/tito.md):

- ``input_ids``: the prompt is exactly these ids (no chat template, no tokenization); ``messages``
  may still be sent but never changes the prompt. Ids come back as ``prompt_token_ids``.
- ``logprob_start_len`` (SGLang's meaning): prompt logprobs from that position on; -1 (the
  default) computes none, so prefix caching stays intact.
- ``token_id`` on every logprob entry and on each of its ``top_logprobs``.
- ``TOOLKIT_RETURN_TOKEN_IDS=1``: ``return_token_ids`` defaults to true for every chat request.
- ``prefix_token_ids`` (also NeMo-RL's ``required_prefix_token_ids``, or NeMo-Gym's token ids on the
  last assistant message): the prompt starts with these ids exactly and continues with what the
  template puts after them (``toolkit.patches.common.prefix_splice``).
- ``tokens`` (prime-rl / verifiers' ``/v1/chat/completions/tokens`` body): the same as ``input_ids``.

On ``/v1/responses`` too: ``input_ids`` as the prompt, and the turn's ids on the response and on each
of its output items (``response_items``).
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from toolkit.patches.common import prefix_splice
from toolkit.patches.common.env import env_flag
from toolkit.patches.common.tito import validate
from toolkit.patches.common.tito.validate import is_int
from toolkit.patches.vllm.tito.response_items import (ItemMarkers, raw_tokens, split_item_ids,
                                                      with_item_done_token_ids, with_output_item_token_ids)

# What the patched engine files call on this module (codemods.py injects ``runtime.<name>``), and the
# Responses output-item rule (response_items.py), re-exported beside the response it completes.
__all__ = ["ItemMarkers", "check_prompt", "normalize_request", "normalize_responses_request",
           "prompt_ids_from_request", "prompt_logprobs_from", "splice_prefix", "split_item_ids",
           "with_item_done_token_ids", "with_logprob_token_ids", "with_output_item_token_ids",
           "with_response_token_ids"]

ENV_RETURN_TOKEN_IDS = "TOOLKIT_RETURN_TOKEN_IDS"


class TitoValidationError(ValueError):
    """A bad request field; stands in for vLLM's VLLMValidationError where vLLM is not installed."""

    def __init__(self, message: str, *, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


def bad_request(message: str, parameter: str) -> Exception:
    """The error vLLM answers with a 400 naming ``parameter`` (raised by the caller)."""
    try:
        from vllm.exceptions import VLLMValidationError
    except ImportError:  # unit tests run without the engine
        return TitoValidationError(message, parameter=parameter)
    return VLLMValidationError(message, parameter=parameter)


def return_token_ids_by_default() -> bool:
    return env_flag(ENV_RETURN_TOKEN_IDS)


# --------------------------------------------------------------------------------------------------
# request fields (ChatCompletionRequest's "before" validator)


def check_input_ids(ids: Any, field: str = "input_ids") -> list[int]:
    """Type checks that need no engine (``validate.check_input_ids``), as vLLM's 400."""
    return validate.check_input_ids(ids, bad_request, field)


def normalize_request(data: Any) -> Any:
    """Check and complete a raw chat request body before pydantic validates its fields.

    With ``input_ids``: ``messages`` becomes optional (``[]``), the chat-template switches that would
    make the response role depend on a last message are reset when there is none, and
    ``return_token_ids`` defaults to true. ``logprob_start_len`` >= 0 turns prompt logprobs on.
    Raises the engine's validation error (HTTP 400) naming the field.
    """
    if not isinstance(data, dict):
        return data
    prefix_splice.normalize_token_fields(data, check_input_ids, bad_request)
    if data.get("prefix_token_ids") is not None and data.get("return_token_ids") is None:
        data["return_token_ids"] = True
    if data.get("input_ids") is not None:  # its types were checked just above (normalize_token_fields)
        if data.get("truncate_prompt_tokens") is not None:
            raise bad_request(
                "`truncate_prompt_tokens` cannot be used with `input_ids`: the prompt is exactly the ids sent",
                "truncate_prompt_tokens",
            )
        if data.get("messages") is None:
            data["messages"] = []
        if isinstance(data["messages"], list) and not data["messages"]:
            # No template runs; the response role is the server's assistant role.
            data["add_generation_prompt"] = True
            data["continue_final_message"] = False
        if data.get("return_token_ids") is None:
            data["return_token_ids"] = True
    elif data.get("return_token_ids") is None and return_token_ids_by_default():
        data["return_token_ids"] = True

    start = validate.check_logprob_start_len(data, bad_request)
    if start is not None and start >= 0:
        if data.get("use_beam_search"):
            raise bad_request("`logprob_start_len` is not available with beam search", "logprob_start_len")
        if data.get("prompt_logprobs") is None:
            top = data.get("top_logprobs")
            data["prompt_logprobs"] = top if data.get("logprobs") and is_int(top) and top > 0 else 0
    return data


# --------------------------------------------------------------------------------------------------
# the prompt (online_renderer._reused_prompt_token_ids, serving._create_chat_completion)


def has_input_ids(request: Any) -> bool:
    fields = getattr(type(request), "model_fields", None) or {}
    return "input_ids" in fields and getattr(request, "input_ids", None) is not None


def vocab_limit(renderer: Any) -> int | None:
    """One past the largest valid token id, by the same rule as vLLM's own token-id check."""
    tokenizer = getattr(renderer, "tokenizer", None)
    model_config = getattr(renderer, "model_config", None)
    limits = []
    if tokenizer is not None:
        limits.append(int(tokenizer.max_token_id) + 1)
    if model_config is not None:
        limits.append(int(model_config.get_vocab_size()))
    return max(limits) if limits else None


def prompt_ids_from_request(request: Any, renderer: Any) -> list[int] | None:
    """The prompt of a chat request that has ``input_ids``, checked against the vocabulary; else None.

    Called first thing in vLLM's "reused prompt token ids" path, so the ids go to the engine exactly
    as vLLM's own pre-tokenized prompts do: no template, no tokenization, while tool-choice checks
    and the parser's ``adjust_request`` still run. ``input_ids`` win over ids forwarded in
    ``kv_transfer_params``.
    """
    if not has_input_ids(request):
        return None
    ids: list[int] = request.input_ids  # list[int]: the request validator checked the types (normalize_request)
    kv = getattr(request, "kv_transfer_params", None)
    if isinstance(kv, dict):
        kv.pop("prompt_token_ids", None)
    validate.check_in_vocabulary(ids, vocab_limit(renderer), bad_request, "input_ids")
    return list(ids)


def _tokenizer_template(renderer: Any, chat_params: Any) -> prefix_splice.Template:
    """The request's chat template and the server's tokenizer, as vLLM renders chat prompts."""
    import dataclasses

    tokenizer = renderer.get_tokenizer()

    def render(messages: list, add_generation_prompt: bool | None) -> str:
        params = chat_params
        if add_generation_prompt is not None:
            kwargs = dict(chat_params.chat_template_kwargs or {})
            kwargs.update(add_generation_prompt=add_generation_prompt, continue_final_message=False)
            params = dataclasses.replace(chat_params, chat_template_kwargs=kwargs)
        _, prompt = renderer.render_messages(messages, params)
        text = prompt.get("prompt") if isinstance(prompt, dict) else None
        if not isinstance(text, str):
            raise bad_request("`prefix_token_ids` needs a chat template that renders text (this tokenizer "
                              "renders token ids)", "prefix_token_ids")
        return text

    encode, decode = prefix_splice.tokenizer_codec(tokenizer)
    return prefix_splice.Template(render=render, encode=encode, decode=decode)


def splice_prefix(request: Any, renderer: Any, messages: list, chat_params: Any, engine_input: Any) -> Any:
    """With ``prefix_token_ids``: the rendered prompt becomes the prefix ids exactly, then what the
    template puts after them (``prefix_splice.splice``); otherwise ``engine_input`` unchanged.

    Called in ``OnlineRenderer.preprocess_chat`` right after the template rendered ``messages``; the
    engine input is changed in place, so the response's ``prompt_token_ids`` are the spliced prompt.
    """
    prefix = getattr(request, "prefix_token_ids", None)
    if prefix is None or not isinstance(engine_input, dict):
        return engine_input
    if engine_input.get("type", "token") != "token" or "prompt_token_ids" not in engine_input:
        raise bad_request("`prefix_token_ids` works with text conversations only (this prompt has media)",
                          "prefix_token_ids")
    # the request validator checked the types (normalize_request)
    validate.check_in_vocabulary(prefix, vocab_limit(renderer), bad_request, "prefix_token_ids")
    rendered = engine_input["prompt_token_ids"]
    if list(rendered[: len(prefix)]) == list(prefix):
        return engine_input  # re-rendering reproduced the prefix: nothing to splice
    template = _tokenizer_template(renderer, chat_params)
    rendered_text = engine_input.get("prompt")
    if not isinstance(rendered_text, str):
        rendered_text = template.decode(rendered)
    try:
        result = prefix_splice.splice(prefix, rendered, rendered_text, messages, template)
    except prefix_splice.SpliceError as error:
        raise bad_request(str(error), error.parameter) from None
    engine_input["prompt_token_ids"] = result.prompt
    engine_input["prompt"] = result.text  # without it vLLM would detokenize the prompt again
    return engine_input


def _prompt_ids(engine_input: Any) -> Sequence[int] | None:
    if isinstance(engine_input, dict):
        return engine_input.get("prompt_token_ids")
    return getattr(engine_input, "prompt_token_ids", None)


def check_prompt(request: Any, engine_inputs: Iterable[Any], max_model_len: int) -> None:
    """Checks that need the rendered prompt (chat and Responses requests); raises the engine's
    validation error (HTTP 400).

    With ``input_ids`` the prompt plus ``max_tokens`` (``max_output_tokens`` on /v1/responses) (at least one token when unset) must fit the
    context: vLLM would otherwise clamp the output budget silently. ``logprob_start_len`` must be a
    position inside the prompt.
    """
    start = getattr(request, "logprob_start_len", None)
    with_ids = has_input_ids(request) or getattr(request, "prefix_token_ids", None) is not None
    field = "input_ids" if has_input_ids(request) else "prefix_token_ids"
    label = "`input_ids`" if field == "input_ids" else "the spliced prompt (`prefix_token_ids` and the new turn)"
    if not with_ids and (start is None or start < 0):
        return
    for engine_input in engine_inputs:
        ids = _prompt_ids(engine_input)
        if ids is None:
            continue
        length = len(ids)
        if with_ids:
            # chat: max_completion_tokens, else max_tokens; the Responses API: max_output_tokens
            budget, max_tokens = next(((name, value) for name, value in
                                       ((name, getattr(request, name, None)) for name in
                                        ("max_completion_tokens", "max_tokens", "max_output_tokens"))
                                       if value is not None), ("max_tokens", None))
            budget = "max_output_tokens" if budget == "max_output_tokens" else "max_tokens"
            if max_tokens is None:
                if length >= max_model_len:
                    raise bad_request(
                        f"{label} has {length} tokens, which leaves no room for output in the "
                        f"model's context of {max_model_len} tokens",
                        field,
                    )
            elif length + max_tokens > max_model_len:
                raise bad_request(
                    f"{label} has {length} tokens and {budget} is {max_tokens}: {length + max_tokens} "
                    f"exceeds the model's context of {max_model_len} tokens",
                    field,
                )
        validate.check_logprob_start_in_prompt(start, length, bad_request)


# --------------------------------------------------------------------------------------------------
# the response (serving.py)


def prompt_logprobs_from(request: Any, prompt_logprobs: list | None) -> list | None:
    """Prompt logprobs before ``logprob_start_len`` become None, keeping one entry per prompt id."""
    start = getattr(request, "logprob_start_len", None)
    if prompt_logprobs is None or start is None or start <= 0:
        return prompt_logprobs
    return [None] * min(start, len(prompt_logprobs)) + list(prompt_logprobs[start:])


def with_logprob_token_ids(logprobs: Any, token_ids: Sequence[int], top_logprobs: Sequence[Any]) -> Any:
    """Set ``token_id`` on each logprob entry and on each of its ``top_logprobs``.

    ``logprobs.content[i]`` is the i-th sampled token; its ``top_logprobs`` are the first entries of
    the engine's per-position dict (vLLM keeps that order), so the ids come from the dict's keys.
    """
    for entry, token_id, step in zip(logprobs.content or (), token_ids, top_logprobs):
        entry.token_id = int(token_id)
        if step and entry.top_logprobs:
            for top, top_id in zip(entry.top_logprobs, step):
                top.token_id = int(top_id)
    return logprobs


# --------------------------------------------------------------------------------------------------
# the Responses API (responses/protocol.py's ResponsesRequest, responses/serving.py)


def normalize_responses_request(data: Any) -> Any:
    """Check and complete a raw ``/v1/responses`` body before pydantic validates its fields.

    With ``input_ids``: ``input`` becomes optional (``""``; the prompt is the ids, through the same
    reused-ids path as chat) and ``return_token_ids`` defaults to true; history from elsewhere
    (``previous_response_id``, ``previous_input_messages``) would be silently dropped, so it is a 400.
    Without: ``TOOLKIT_RETURN_TOKEN_IDS=1`` makes ``return_token_ids`` default to true.
    """
    if not isinstance(data, dict):
        return data
    if data.get("input_ids") is not None:
        check_input_ids(data["input_ids"])
        for field in ("previous_response_id", "previous_input_messages"):
            if data.get(field):
                raise bad_request(f"`{field}` cannot be used with `input_ids`: the prompt is exactly the ids sent",
                                  field)
        if data.get("input") is None:
            data["input"] = ""
        if data.get("return_token_ids") is None:
            data["return_token_ids"] = True
    elif data.get("return_token_ids") is None and return_token_ids_by_default():
        data["return_token_ids"] = True
    return data


def with_response_token_ids(request: Any, response: Any, context: Any, tokenizer: Any = None) -> Any:
    """``prompt_token_ids`` and ``token_ids`` on a Responses response when the request asks for them.

    The ids are vLLM's own record of the turn (the context's ``input_messages`` / ``output_messages``,
    which ``enable_response_messages`` would return as raw-message records): the exact prompt the
    engine ran and every output id, accumulated the same way streaming and not. The response model
    allows extra fields, so a response without ``return_token_ids`` keeps vLLM's exact shape.
    Called where ``responses_full_generator`` builds the response, which is also the streaming
    path's ``response.completed``. Each output item gets its own ``token_ids`` too
    (``with_output_item_token_ids``).
    """
    if not getattr(request, "return_token_ids", None):
        return response
    prompt = raw_tokens(getattr(context, "input_messages", None))
    output = raw_tokens(getattr(context, "output_messages", None))
    if not prompt or output is None:
        return response  # Harmony (gpt-oss) keeps its own message records
    response.prompt_token_ids = prompt[0]
    response.token_ids = [i for ids in output for i in ids]
    with_output_item_token_ids(request, getattr(response, "output", None), context, tokenizer)
    return response
