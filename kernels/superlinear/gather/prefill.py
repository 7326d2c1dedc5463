"""Prefill (and prefill chunks) on the gather path: O(L_Q * sqrt(L_KV)) time and memory.

Per batch row and query chunk: ``search.search_rows``; span bounds (``attention_spans.span_bounds``,
the shared integer tables); ``partials.window_partials`` and ``partials.span_partials``;
``merge.merge_and_gate``.  Nothing of size L_Q x L_KV is ever built.
"""

from __future__ import annotations

import threading

import torch

from ..attention_spans import SuperlinearParams, span_bounds
from .workspace import QUERY_CHUNK, KeyRow, Workspace, chunks, prepare
from .merge import merge_and_gate
from .partials import span_partials, window_partials
from .search import search_rows

_local = threading.local()


def _workspace(device: torch.device) -> Workspace:
    """The calling thread's CPU workspace, kept between calls: an engine calls once per layer and
    chunk, and fresh scratch buffers each time cost their first-touch page faults again (~10 % of
    an 8K-token call).  Other devices get a fresh one (no device memory held between calls)."""
    if device.type != "cpu":
        return Workspace(device)
    ws = getattr(_local, "workspace", None)
    if ws is None:
        ws = _local.workspace = Workspace(device)
    return ws


def gather_superlinear_attention(q1, q2, k, v, cache_position=None, attention_mask=None,
                                 params: SuperlinearParams | None = None, scale: float | None = None,
                                 query_chunk: int = QUERY_CHUNK, return_search: bool = False):
    """Superlinear attention (prefill or a chunk of it) in O(L_Q * sqrt(L_KV)) time and memory.

    q1, q2 ``[B, H_Q, L_Q, D]``; k, v ``[B, H_KV, L_KV, D]``.  Returns ``[B, H_Q, L_Q, D]`` in
    ``q2``'s dtype (and, with ``return_search``, anchors, scores and span bounds).
    """
    params, positions, key_mask, start, geometry, scale = prepare(
        q1, q2, k, v, cache_position, attention_mask, params, scale)
    batch, heads, query_len, dim = q2.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    topk = params.topk
    out = torch.empty(q2.shape, dtype=q2.dtype, device=q2.device)
    ws = _workspace(q2.device)
    search = None
    if return_search:
        shape = (batch, heads, query_len, topk)
        search = [torch.empty(shape, dtype=torch.int64, device=q2.device),
                  torch.empty(shape, dtype=torch.float32, device=q2.device),
                  torch.empty(shape, dtype=torch.int64, device=q2.device),
                  torch.empty(shape, dtype=torch.int64, device=q2.device)]
    for b in range(batch):
        keys = KeyRow.build(k[b], v[b], None if key_mask is None else key_mask[b])
        for lo, hi in chunks(query_len, query_chunk):
            count = hi - lo
            pos = positions[b, lo:hi]
            q1_rows = q1[b, :, lo:hi].float().view(kv_heads, group, count, dim)
            q2_rows = q2[b, :, lo:hi].float().view(kv_heads, group, count, dim)
            anchors, scores = search_rows(q1_rows, keys, pos, geometry, topk, ws)
            span_lo, span_hi = span_bounds(anchors.view(1, heads, count, topk), pos[None], start[b:b + 1], geometry)
            span_lo = span_lo.view(kv_heads, group, count, topk)
            span_hi = span_hi.view(kv_heads, group, count, topk)
            win = window_partials(q2_rows, keys, pos, geometry.window, scale)
            spans = span_partials(q2_rows, keys, span_lo, span_hi, scale, ws)
            # mypy cannot count a starred tuple's items
            res = merge_and_gate(*spans, *win, anchors, scores)  # type: ignore[call-arg]
            out[b, :, lo:hi] = res.view(heads, count, dim).to(out.dtype)
            if search is not None:
                for dst, src in zip(search, (anchors, scores, span_lo, span_hi)):
                    dst[b, :, lo:hi] = src.reshape(heads, count, topk)
    if return_search:
        assert search is not None  # made above when return_search
        return out, tuple(search)
    return out


def gather_superlinear_search(q1, k, cache_position=None, attention_mask=None,
                              params: SuperlinearParams | None = None, query_chunk: int = QUERY_CHUNK):
    """Anchors, scores and span bounds ``[B, H_Q, L_Q, k]`` (the search step alone)."""
    params, positions, key_mask, start, geometry, _ = prepare(
        q1, q1, k, k, cache_position, attention_mask, params, 1.0)
    batch, heads, query_len, dim = q1.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    topk = params.topk
    ws = Workspace(q1.device)
    anchors = torch.empty((batch, heads, query_len, topk), dtype=torch.int64, device=q1.device)
    scores = torch.empty((batch, heads, query_len, topk), dtype=torch.float32, device=q1.device)
    for b in range(batch):
        keys = KeyRow.build(k[b], k[b], None if key_mask is None else key_mask[b])
        for lo, hi in chunks(query_len, query_chunk):
            q1_rows = q1[b, :, lo:hi].float().view(kv_heads, group, hi - lo, dim)
            a, sc = search_rows(q1_rows, keys, positions[b, lo:hi], geometry, topk, ws)
            anchors[b, :, lo:hi] = a.reshape(heads, hi - lo, topk)
            scores[b, :, lo:hi] = sc.reshape(heads, hi - lo, topk)
    span_lo, span_hi = span_bounds(anchors, positions, start, geometry)
    return anchors, scores, span_lo, span_hi
