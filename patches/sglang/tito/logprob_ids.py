"""``token_id`` on SGLang's chat logprob entries and on each of their ``top_logprobs`` (the tito patch).

Decorators of ``OpenAIServingChat``'s logprob builders, which drop the ids of the engine's
``(logprob, id, text)`` triples: 0.5.21 on builds every entry in ``_build_token_logprobs_from_raw``,
earlier releases in ``_process_response_logprobs`` and ``_process_streaming_logprobs``. The patched
serving_chat.py reaches them through ``runtime``, which re-exports them. Standard library only.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any


def set_logprob_token_ids(entries: Sequence[Any], raw_tokens: Sequence[Any], raw_tops: Sequence[Any] | None) -> None:
    """Set ``token_id`` on logprob entries built, one per engine triple, from ``raw_tokens``
    (``(logprob, id, text)``), and on each entry's ``top_logprobs`` from ``raw_tops``.

    SGLang 0.5.9 first turns each top-logprobs row into a dict keyed by the token's text, so two ids
    with one text collapse into one entry holding the later one's logprob: the id that goes with an
    entry is the last one of that text in the row, found the same way.
    """
    raw_tops = raw_tops or []
    for position, entry in enumerate(entries):
        if position < len(raw_tokens):
            entry.token_id = int(raw_tokens[position][1])
        tops = getattr(entry, "top_logprobs", None)
        row = raw_tops[position] if position < len(raw_tops) else None
        if not tops or not row:
            continue
        if len(tops) == len(row) and all((top.token or "") == (raw[2] or "") for top, raw in zip(tops, row)):
            for top, raw in zip(tops, row):
                top.token_id = int(raw[1])
            continue
        by_text = {}
        for raw in row:
            by_text[raw[2]] = int(raw[1])
        for top in tops:
            if top.token in by_text:
                top.token_id = by_text[top.token]


def logprob_ids_from_raw(method: Callable) -> Callable:
    """Decorate SGLang 0.5.23's ``_build_token_logprobs_from_raw(self, output_token_logprobs,
    output_top_logprobs)``: each entry it builds gets the id of its triple."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def build(self: Any, *args: Any, **kwargs: Any) -> Any:
        entries = method(self, *args, **kwargs)
        arguments = signature.bind_partial(self, *args, **kwargs).arguments
        set_logprob_token_ids(entries, arguments.get("output_token_logprobs") or [],
                              arguments.get("output_top_logprobs"))
        return entries

    return build


def response_logprob_ids(method: Callable) -> Callable:
    """Decorate SGLang 0.5.9's ``_process_response_logprobs(self, ret_item)``."""

    @functools.wraps(method)
    def process(self: Any, ret_item: dict, *args: Any, **kwargs: Any) -> Any:
        logprobs = method(self, ret_item, *args, **kwargs)
        meta_info = ret_item["meta_info"]
        set_logprob_token_ids(logprobs.content, meta_info["output_token_logprobs"],
                              meta_info.get("output_top_logprobs"))
        return logprobs

    return process


def stream_logprob_ids(method: Callable) -> Callable:
    """Decorate SGLang 0.5.9's ``_process_streaming_logprobs(self, content, n_prev_token)``: the
    entries stand for the engine's triples from ``n_prev_token`` on.

    0.5.9 gives every entry of a chunk the top logprobs of the chunk's first token (it assumes one
    token per chunk; outputs that queue up carry several). Each entry's ``top_logprobs`` are rebuilt
    from its own row, as the non-streaming path builds them, so that their ids are right.

    From 0.5.11 an incremental stream's meta_info holds only the new triples (the release does not
    slice them by ``n_prev_token``): the entries then stand for the last ones, whatever the offset.
    """

    @functools.wraps(method)
    def process(self: Any, content: dict, n_prev_token: int, *args: Any, **kwargs: Any) -> Any:
        logprobs = method(self, content, n_prev_token, *args, **kwargs)
        meta_info = content["meta_info"]
        tokens = meta_info["output_token_logprobs"]
        start = n_prev_token
        if len(tokens) - n_prev_token != len(logprobs.content):
            start = max(len(tokens) - len(logprobs.content), 0)
        rows = (meta_info.get("output_top_logprobs") or [])[start:]
        for position, entry in enumerate(logprobs.content):
            if position and position < len(rows) and rows[position] is not None and entry.top_logprobs:
                entry.top_logprobs = _tops_from_row(type(entry.top_logprobs[0]), rows[position])
        set_logprob_token_ids(logprobs.content, tokens[start:], rows)
        return logprobs

    return process


def _tops_from_row(top_class: Callable[..., Any], row: Sequence[Any]) -> list:
    """0.5.9's top-logprob entries for one row of triples: keyed by text, a later duplicate wins."""
    by_text: dict[str, Any] = {}
    for logprob, _, text in row:
        by_text[text] = logprob
    return [top_class(token=text, bytes=list(text.encode("utf-8")), logprob=logprob)
            for text, logprob in by_text.items()]
