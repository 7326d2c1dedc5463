"""The request checks both engines' tito runtimes share: ``input_ids`` and ``logprob_start_len``.

One check per rule, each run once per request: the types of a list of ids (``check_input_ids``) when the
request body is validated (the engines' pydantic "before" validators: ``normalize_request``), and the
vocabulary (``check_in_vocabulary``) where the served model is known. Later steps read the fields pydantic
built (``list[int]``) and do not check their types again.

Each engine answers bad input with its own error (vLLM's validation error naming the parameter,
SGLang's ``ValueError``), so every check takes ``error(message, field)``, the engine's error for a
message about ``field``, as ``prefix_splice.normalize_token_fields`` does; the messages are the
same on both engines. Standard library only: imported inside the engines' API-server processes.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence, TypeGuard

ErrorFactory = Callable[[str, str], Exception]  # (message, field) -> the engine's 400, raised by the caller


def is_int(value: Any) -> TypeGuard[int]:
    return type(value) is int  # bool is an int subclass; JSON 1.0 is a float: neither is a token id


def check_input_ids(ids: Any, error: ErrorFactory, field: str = "input_ids") -> list[int]:
    """Type checks that need no engine: a non-empty list of non-negative ints."""
    if not isinstance(ids, list):
        raise error(f"`{field}` must be a list of integer token ids, got {type(ids).__name__}", field)
    if not ids:
        raise error(f"`{field}` must not be empty: the prompt needs at least one token", field)
    if all(type(value) is int for value in ids) and min(ids) >= 0:
        return ids  # the common case, in C-speed loops; the loop below finds what is wrong
    for position, value in enumerate(ids):
        if not is_int(value):
            raise error(
                f"`{field}` must contain only integers: item {position} is {type(value).__name__} {value!r:.40}",
                field,
            )
        if value < 0:
            raise error(f"`{field}` must not contain negative ids: item {position} is {value}", field)
    return ids


def check_in_vocabulary(ids: Sequence[int], limit: int | None, error: ErrorFactory, field: str) -> None:
    """Every id below ``limit`` (one past the largest token id; None: unknown, nothing to check)."""
    if limit is None or not ids or max(ids) < limit:
        return
    position = next(i for i, value in enumerate(ids) if value >= limit)
    raise error(f"`{field}` item {position} is {ids[position]}, out of the vocabulary (ids must be < {limit})", field)


def check_logprob_start_len(data: dict, error: ErrorFactory) -> int | None:
    """``logprob_start_len`` of a raw request body: -1 (no prompt logprobs) or a prompt position,
    and a position only without ``stream`` (prompt logprobs are non-streaming only). Returns it, or
    None when the body has none."""
    start = data.get("logprob_start_len")
    if start is None:
        return None
    if not is_int(start):
        raise error(f"`logprob_start_len` must be an integer, got {type(start).__name__} {start!r:.40}",
                    "logprob_start_len")
    if start < -1:
        raise error(f"`logprob_start_len` must be -1 (no prompt logprobs) or a prompt position >= 0, got {start}",
                    "logprob_start_len")
    if start >= 0 and data.get("stream"):
        raise error("`logprob_start_len` is not available with `stream=true` (prompt logprobs are non-streaming only)",
                    "logprob_start_len")
    return start


def check_logprob_start_in_prompt(start: int | None, length: int, error: ErrorFactory) -> None:
    """``logprob_start_len`` must be a position inside the rendered prompt of ``length`` ids."""
    if start is not None and start >= length:
        raise error(f"`logprob_start_len` is {start}, but the prompt has only {length} tokens "
                    f"(use -1, or a position from 0 to {length - 1})", "logprob_start_len")
