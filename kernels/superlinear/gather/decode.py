"""One decode step per batch row on the gather path: the same search, partials and merge as
prefill, reading O(sqrt t) keys per row."""

from __future__ import annotations

from ..attention_spans import SuperlinearParams, span_bounds
from .workspace import prepare
from .merge import merge_and_gate
from .partials import span_partials_decode, window_decode
from .search import search_decode


def gather_superlinear_decode(q1, q2, k, v, cache_position, attention_mask=None,
                              params: SuperlinearParams | None = None, scale: float | None = None):
    """One decode step per batch row: q ``[B, H_Q, 1, D]``, each row at its own position.

    ``cache_position``: ``[B]`` (or ``[1]``/int shared).  K/V may be a longer static cache: keys
    after a row's position are never read.
    """
    params, positions, key_mask, start, geometry, scale = prepare(
        q1, q2, k, v, cache_position, attention_mask, params, scale)
    batch, heads, query_len, dim = q2.shape
    if query_len != 1:
        raise ValueError(f"decode takes one query per row, got L_Q={query_len}")
    kv_heads = k.shape[1]
    group, topk = heads // kv_heads, params.topk
    pos = positions[:, 0]  # [B]
    q1f = q1.float().view(batch, kv_heads, group, dim)
    q2f = q2.float().view(batch, kv_heads, group, dim)
    anchors, scores = search_decode(q1f, k, pos, key_mask, geometry, topk)
    span_lo, span_hi = span_bounds(anchors.view(batch, heads, 1, topk), positions, start, geometry)
    shape = (batch, kv_heads, group, topk)
    spans = span_partials_decode(q2f, k, v, span_lo.view(shape), span_hi.view(shape), key_mask, scale)
    win = window_decode(q2f, k, v, pos, key_mask, geometry.window, scale)
    # mypy cannot count a starred tuple's items
    out = merge_and_gate(*spans, *win, anchors, scores)  # type: ignore[call-arg]
    return out.reshape(batch, heads, 1, dim).to(q2.dtype)
