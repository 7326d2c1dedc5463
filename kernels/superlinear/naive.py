"""Dense-mask reference of superlinear attention: obviously right, O(L^2) memory, tests only.

Every step is spelled out on full ``[L_Q, L_KV]`` matrices: the candidate mask of the search, a
stable sort for the top-k, one boolean key mask per span (span plus window), a masked softmax per
span, and the score-softmax gate.  Attention is computed in float64; search scores in float32
(the spec defines them as fp32 dot products, and the selection must match the fast paths).
Query rows are processed in chunks only to bound memory.
"""

from __future__ import annotations

import math

import torch

from .attention_spans import (
    SuperlinearParams,
    check_positions,
    key_start,
    normalize_key_mask,
    normalize_positions,
    span_bounds,
    span_geometry,
)

_ROWS_PER_CHUNK = 256


def _candidate_mask(positions: torch.Tensor, key_mask: torch.Tensor | None, key_len: int,
                    params: SuperlinearParams, geometry) -> torch.Tensor:
    """``[B, L_Q, L_KV]``: key ``a`` is a search candidate of query ``q`` (on a stripe, real)."""
    is_stripe_distance = torch.zeros(geometry.max_len + 2, dtype=torch.bool)
    is_stripe_distance[geometry.stripe_distance] = True  # distances F(i), i > sw_index
    keys = torch.arange(key_len)
    distance = positions[:, :, None] + 1 - keys  # q + 1 - a
    ok = (distance >= 1) & is_stripe_distance[distance.clamp(0, geometry.max_len + 1)]
    if key_mask is not None:
        ok &= key_mask[:, None, :]
    return ok


def naive_search(q1: torch.Tensor, k: torch.Tensor, cache_position=None, attention_mask=None,
                 params: SuperlinearParams | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k anchors ``[B, H_Q, L_Q, k]`` (int64, -1 = none) and their fp32 scores (-inf = none).

    Anchors are sorted best first: higher score, then farther (smaller) anchor on ties.
    """
    params = params or SuperlinearParams()
    batch, heads, query_len, _ = q1.shape
    key_len = k.shape[2]
    group = heads // k.shape[1]
    positions = normalize_positions(cache_position, batch, query_len, key_len, torch.device("cpu"))
    key_mask = normalize_key_mask(attention_mask, batch, key_len, torch.device("cpu"))
    geometry = span_geometry(params, key_len)
    kk = k.detach().cpu().float().repeat_interleave(group, dim=1)
    anchors, scores = [], []
    for lo in range(0, query_len, _ROWS_PER_CHUNK):
        hi = min(query_len, lo + _ROWS_PER_CHUNK)
        cand = _candidate_mask(positions[:, lo:hi], key_mask, key_len, params, geometry)
        s = q1[:, :, lo:hi].detach().cpu().float() @ kk.transpose(-1, -2)  # raw dot, no 1/sqrt(D)
        s = s + 0.0  # -0.0 == +0.0 for ordering
        s = s.masked_fill(~cand[:, None], float("-inf"))
        # A stable sort keeps keys in ascending position among equal scores: the farther anchor wins.
        order = torch.sort(s, dim=-1, descending=True, stable=True).indices[..., : params.topk]
        top = torch.gather(s, -1, order)
        found = top > float("-inf")
        anchors.append(torch.where(found, order, -1))
        scores.append(top)
    anchor = torch.cat(anchors, dim=2)
    score = torch.cat(scores, dim=2)
    if anchor.shape[-1] < params.topk:  # fewer keys than topk
        pad = params.topk - anchor.shape[-1]
        anchor = torch.nn.functional.pad(anchor, (0, pad), value=-1)
        score = torch.nn.functional.pad(score, (0, pad), value=float("-inf"))
    return anchor, score


def naive_superlinear_attention(q1, q2, k, v, cache_position=None, attention_mask=None,
                                params: SuperlinearParams | None = None, scale: float | None = None,
                                return_search: bool = False):
    """Superlinear attention by dense masks; output ``[B, H_Q, L_Q, D]`` in ``q2``'s dtype."""
    params = params or SuperlinearParams()
    batch, heads, query_len, dim = q2.shape
    key_len = k.shape[2]
    group = heads // k.shape[1]
    scale = 1.0 / math.sqrt(dim) if scale is None else scale
    cpu = torch.device("cpu")
    positions = normalize_positions(cache_position, batch, query_len, key_len, cpu)
    check_positions(positions, key_len)
    key_mask = normalize_key_mask(attention_mask, batch, key_len, cpu)
    start = key_start(key_mask, batch, key_len, cpu)
    geometry = span_geometry(params, key_len)
    anchor, score = naive_search(q1, k, positions, key_mask, params)
    span_lo, span_hi = span_bounds(anchor, positions, start, geometry)

    kk = k.detach().cpu().double().repeat_interleave(group, dim=1)
    vv = v.detach().cpu().double().repeat_interleave(group, dim=1)
    keys = torch.arange(key_len)
    out = torch.zeros(batch, heads, query_len, dim, dtype=torch.float64)
    for lo in range(0, query_len, _ROWS_PER_CHUNK):
        hi = min(query_len, lo + _ROWS_PER_CHUNK)
        pos = positions[:, None, lo:hi, None]  # [B, 1, C, 1]
        real = (keys <= pos) & (keys >= start[:, None, None, None])
        if key_mask is not None:
            real &= key_mask[:, None, None, :]
        window = real & (keys > pos - geometry.window)
        logits = (q2[:, :, lo:hi].detach().cpu().double() @ kk.transpose(-1, -2)) * scale
        span_outputs = []
        for j in range(params.topk):
            in_span = (keys >= span_lo[:, :, lo:hi, j, None]) & (keys <= span_hi[:, :, lo:hi, j, None])
            allowed = window | (real & in_span)
            weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), dim=-1)
            weights = torch.nan_to_num(weights, nan=0.0)  # a query with no key at all outputs 0
            span_outputs.append(weights @ vv)
        stacked = torch.stack(span_outputs, dim=3)  # [B, H, C, k, D]
        sc = score[:, :, lo:hi].double()
        found = anchor[:, :, lo:hi] >= 0
        gate = torch.softmax(sc.masked_fill(~found, float("-inf")), dim=-1)
        # No valid span: every O_j is window-only attention, and the gate is uniform.
        gate = torch.where(found.any(-1, keepdim=True), gate, 1.0 / params.topk)
        out[:, :, lo:hi] = (gate[..., None] * stacked).sum(dim=3)
    out = out.to(q2.dtype)
    if return_search:
        return out, (anchor, score, span_lo, span_hi)
    return out
