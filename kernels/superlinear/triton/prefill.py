"""Triton prefill: search -> span bounds -> window -> tiled span attention -> merge and gate.

Four kernel launches per query chunk plus a few small torch ops (span bounds from the shared
integer tables, canonical order of the k anchors, tile building); no host synchronisation.
Queries are processed in chunks only to bound the per-(query, span) partial buffers.
"""

from __future__ import annotations

import math

import torch

from ..attention_spans import (
    SuperlinearParams,
    key_start,
    normalize_key_mask,
    normalize_positions,
    ordered_score_key,
    span_bounds,
    span_geometry,
)
from ..tiling import build_span_tiles
from . import merge, search, span, window

# Bytes allowed for the per-(query, span) fp32 partials of one query chunk.
PARTIALS_BUDGET = 1 << 30


def _canonical_order(anchor: torch.Tensor, score: torch.Tensor, key_len: int):
    """Sort each query's k anchors best first (score, then farther anchor), like the other paths."""
    valid = anchor >= 0
    key = ordered_score_key(score, (key_len - anchor).clamp(min=0), valid)
    order = key.argsort(dim=-1, descending=True)
    return torch.gather(anchor, -1, order), torch.gather(score, -1, order)


def _prepare(q1, q2, k, cache_position, attention_mask, params):
    batch, heads, query_len, dim = q2.shape
    key_len = k.shape[2]
    device = q2.device
    positions = normalize_positions(cache_position, batch, query_len, key_len, device)
    key_mask = normalize_key_mask(attention_mask, batch, key_len, device)
    start = key_start(key_mask, batch, key_len, device)
    geo64 = span_geometry(params, key_len, device)
    geo32 = span_geometry(params, key_len, device, torch.int32)
    return positions, key_mask, start, geo64, geo32


def _search_chunk(q1, k, positions, key_mask, start, geo64, geo32, params):
    pos32 = positions.to(torch.int32).contiguous()
    anchor, score = search.search(q1, k, pos32, key_mask, geo32.stripe_distance, geo32.stripe_count, params.topk)
    anchor, score = _canonical_order(anchor.long(), score, k.shape[2])
    span_lo, span_hi = span_bounds(anchor, positions, start, geo64)
    return pos32, anchor, score, span_lo, span_hi


def triton_superlinear_search(q1, k, cache_position=None, attention_mask=None,
                              params: SuperlinearParams | None = None):
    """Anchors, scores and span bounds ``[B, H_Q, L_Q, k]`` (int64, fp32, int64, int64)."""
    params = params or SuperlinearParams()
    positions, key_mask, start, geo64, geo32 = _prepare(q1, q1, k, cache_position, attention_mask, params)
    _, anchor, score, lo, hi = _search_chunk(q1, k, positions, key_mask, start, geo64, geo32, params)
    return anchor, score, lo, hi


def triton_superlinear_attention(q1, q2, k, v, cache_position=None, attention_mask=None,
                                 params: SuperlinearParams | None = None, scale: float | None = None,
                                 query_chunk: int | None = None, return_search: bool = False):
    """Superlinear attention with Triton kernels: ``[B, H_Q, L_Q, D]`` in q2's dtype."""
    params = params or SuperlinearParams()
    batch, heads, query_len, dim = q2.shape
    kv_heads, key_len = k.shape[1], k.shape[2]
    group = heads // kv_heads
    topk = params.topk
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    positions, key_mask, start, geo64, geo32 = _prepare(q1, q2, k, cache_position, attention_mask, params)
    tile_pairs, block_k = span.tile_config(dim)
    if query_chunk is None:
        query_chunk = max(1, PARTIALS_BUDGET // (batch * heads * topk * (dim + 1) * 4))
    out = torch.empty(q2.shape, dtype=q2.dtype, device=q2.device)
    found = []
    for lo in range(0, query_len, query_chunk):
        hi = min(query_len, lo + query_chunk)
        count = hi - lo
        q1c, q2c, outc = q1[:, :, lo:hi], q2[:, :, lo:hi], out[:, :, lo:hi]
        pos = positions[:, lo:hi]
        pos32, anchor, score, span_lo, span_hi = _search_chunk(
            q1c, k, pos, key_mask, start, geo64, geo32, params)
        win_lse, win_out = window.window_partials(q2c, k, v, pos32, key_mask, geo64.window, scale)
        # Pair p = ((b * H + h) * count + query) * k + span reads KV group b * H_KV + h // G.
        pair = torch.arange(batch * heads * count * topk, device=q2.device)
        bh = pair // (count * topk)
        pair_group = (bh // heads) * kv_heads + (bh % heads) // group
        tiles = build_span_tiles(span_lo.reshape(-1), span_hi.reshape(-1), pair_group,
                                 batch * kv_heads, key_len, block_k, tile_pairs)
        lo32 = span_lo.reshape(-1).to(torch.int32)
        hi32 = span_hi.reshape(-1).to(torch.int32)
        span_lse, span_out = span.span_partials(q2c, k, v, key_mask, tiles, lo32, hi32, scale, block_k)
        merge.merge_and_gate(win_lse, win_out, span_lse, span_out, anchor.to(torch.int32).contiguous(),
                             score.contiguous(), outc)
        if return_search:
            found.append((anchor, score, span_lo, span_hi))
    if return_search:
        return out, tuple(torch.cat(parts, dim=2) for parts in zip(*found))
    return out
