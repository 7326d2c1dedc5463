"""Triton decode: one query per batch row, each at its own position, in three launches.

1. ``_decode_search_kernel`` (one program per (row, query head)): scores the stripe keys of the
   row's position block by block and keeps the exact top-k (same order as every other path).
2. ``_decode_span_kernel`` (per (row, query head, part, split)): parts 0..k-1 are the spans of the
   selected anchors, part k is the window; each part is split in ``n_split`` key ranges so that a
   single query still spreads over many programs (flash-decoding style).  Span bounds come from the
   shared integer tables on the device.
3. ``_decode_merge_kernel`` (per (row, query head)): log-sum-exp merge of the splits, of each span
   with the window, and the score-softmax gate.

Shapes depend only on the cache length (stripes are enumerated up to it and masked per row), and
nothing synchronises with the host, so the step can be captured in a CUDA graph for a fixed cache.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..attention_spans import (
    SuperlinearParams,
    key_start,
    normalize_key_mask,
    normalize_positions,
    span_geometry,
)
from .jit_helpers import (
    block_dim,
    decode_part_range,
    empty_row_softmax,
    empty_topk_row,
    insert_block_best,
    key_mask_arg,
    load_query_row,
    merge_span,
    row_softmax_step,
    store_split_partial,
    store_topk,
    stripe_block,
)

BLOCK_S = 64  # stripes scored per step
BLOCK_K = 64  # keys per step of the span kernel
SPLIT_KEYS = 512  # keys per split of a span


@triton.jit
def _decode_search_kernel(
    Q, K, POS, KEY_MASK, STRIPE, COUNT, ANCHOR, SCORE,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_kh, stride_kl, stride_kd,
    stride_mb,
    H, G, DIM,
    HAS_MASK: tl.constexpr, TOPK: tl.constexpr, KPAD: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    kvh = h // G
    pos = tl.load(POS + b)
    q, d, d_ok = load_query_row(Q, b, h, stride_qb, stride_qh, stride_qd, DIM, BLOCK_D)
    k_ptr = K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh
    slot, ts, ta = empty_topk_row(KPAD, TOPK)
    n = tl.load(COUNT + pos)
    for j0 in range(0, n, BLOCK_S):
        a, ok = stripe_block(STRIPE, pos, j0, n, BLOCK_S)
        if HAS_MASK:
            ok = ok & (tl.load(KEY_MASK + b * stride_mb + a, mask=ok, other=0) != 0)
        kr = tl.load(k_ptr + a[:, None].to(tl.int64) * stride_kl + d[None, :] * stride_kd,
                     mask=ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        ts, ta = insert_block_best(ts, ta, q, kr, a, ok, TOPK)
    store_topk(ANCHOR, SCORE, pid.to(tl.int64) * TOPK + slot, slot < TOPK, ts, ta)


@triton.jit
def _decode_span_kernel(
    Q, K, V, POS, START, KEY_MASK, ANCHOR, BACK, FWD, PART_LSE, PART_OUT,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_kh, stride_kl, stride_kd,
    stride_vb, stride_vh, stride_vl, stride_vd,
    stride_mb,
    H, G, DIM, WINDOW, MAX_T, SPLIT, N_SPLIT, scale,
    HAS_MASK: tl.constexpr, TOPK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    part = tl.program_id(1)
    split = tl.program_id(2)
    b = pid // H
    h = pid % H
    kvh = h // G
    pos = tl.load(POS + b)
    first = tl.load(START + b)
    lo, hi = decode_part_range(ANCHOR, BACK, FWD, pid, part, split, pos, first, WINDOW, MAX_T, SPLIT, TOPK)
    q, d, d_ok = load_query_row(Q, b, h, stride_qb, stride_qh, stride_qd, DIM, BLOCK_D)
    k_ptr = K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh
    v_ptr = V + b.to(tl.int64) * stride_vb + kvh.to(tl.int64) * stride_vh
    m_i, l_i, acc = empty_row_softmax(BLOCK_K, BLOCK_D)
    for k0 in range(lo, hi + 1, BLOCK_K):
        kpos = k0 + tl.arange(0, BLOCK_K)
        k_ok = kpos <= hi
        if HAS_MASK:
            k_ok = k_ok & (tl.load(KEY_MASK + b * stride_mb + kpos, mask=k_ok, other=0) != 0)
        kt = tl.load(k_ptr + kpos[:, None].to(tl.int64) * stride_kl + d[None, :] * stride_kd,
                     mask=k_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        vt = tl.load(v_ptr + kpos[:, None].to(tl.int64) * stride_vl + d[None, :] * stride_vd,
                     mask=k_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        m_i, l_i, acc = row_softmax_step(m_i, l_i, acc, q, kt, vt, k_ok, scale)
    store_split_partial(PART_LSE, PART_OUT, pid, part, split, N_SPLIT, DIM, d, d_ok, m_i, l_i, acc, TOPK)


@triton.jit
def _combine_splits(PART_LSE, PART_OUT, base, N_SPLIT, DIM, NS_PAD: tl.constexpr, BLOCK_D: tl.constexpr):
    """(lse, out) of one part from its splits' partials."""
    sp = tl.arange(0, NS_PAD)
    d = tl.arange(0, BLOCK_D)
    ok = sp < N_SPLIT
    lse = tl.load(PART_LSE + base + sp, mask=ok, other=float("-inf"))
    out = tl.load(PART_OUT + (base + sp)[:, None] * DIM + d[None, :], mask=ok[:, None] & (d[None, :] < DIM), other=0.0)
    top = tl.max(lse, 0)
    top_use = tl.where(top == float("-inf"), 0.0, top)
    w = tl.exp(lse - top_use)
    total = tl.sum(w, 0)
    merged = tl.sum(w[:, None] * out, 0) / tl.where(total > 0, total, 1.0)
    merged_lse = tl.where(total > 0, top_use + tl.log(tl.where(total > 0, total, 1.0)), float("-inf"))
    return merged_lse, merged


@triton.jit
def _decode_merge_kernel(
    PART_LSE, PART_OUT, ANCHOR, SCORE, OUT,
    stride_ob, stride_oh, stride_od,
    H, DIM, N_SPLIT,
    TOPK: tl.constexpr, NS_PAD: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < DIM
    base = pid.to(tl.int64) * (TOPK + 1) * N_SPLIT
    win_lse, win_out = _combine_splits(PART_LSE, PART_OUT, base + TOPK * N_SPLIT, N_SPLIT, DIM, NS_PAD, BLOCK_D)
    one = tl.arange(0, 1)  # merge_span works on rows; decode is a block of one row
    win_lse1 = win_lse + tl.zeros([1], tl.float32)
    win_out1 = win_out[None, :]
    score_max = tl.full([1], float("-inf"), tl.float32)
    for j in tl.static_range(TOPK):
        a = tl.load(ANCHOR + pid * TOPK + j + one)
        sc = tl.load(SCORE + pid * TOPK + j + one)
        score_max = tl.maximum(score_max, tl.where(a >= 0, sc, float("-inf")))
    score_max = tl.where(score_max == float("-inf"), 0.0, score_max)
    acc = tl.zeros([1, BLOCK_D], tl.float32)
    gate_sum = tl.zeros([1], tl.float32)
    for j in tl.static_range(TOPK):
        a = tl.load(ANCHOR + pid * TOPK + j + one)
        sc = tl.load(SCORE + pid * TOPK + j + one)
        span_lse, span_out = _combine_splits(PART_LSE, PART_OUT, base + j * N_SPLIT, N_SPLIT, DIM, NS_PAD, BLOCK_D)
        acc, gate_sum = merge_span(acc, gate_sum, score_max, a, sc, span_lse + tl.zeros([1], tl.float32),
                                   span_out[None, :], win_lse1, win_out1)
    out = tl.where((gate_sum > 0)[:, None], acc / tl.where(gate_sum > 0, gate_sum, 1.0)[:, None], win_out1)
    b = pid // H
    h = pid % H
    tl.store(OUT + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + d[None, :] * stride_od,
             out.to(OUT.dtype.element_ty), mask=d_ok[None, :])


def decode_splits(params: SuperlinearParams, max_seq_len: int) -> tuple[int, int]:
    """(n_split, keys per split) for the longest span or window a query below ``max_seq_len`` can
    have: host tables only, so the grid is static."""
    host_geo = span_geometry(params, max_seq_len)
    longest = max(host_geo.max_span_len(max_seq_len), host_geo.window, 1)
    n_split = triton.cdiv(longest, SPLIT_KEYS)
    split = triton.cdiv(triton.cdiv(longest, n_split), BLOCK_K) * BLOCK_K
    return n_split, split


def triton_superlinear_decode(q1, q2, k, v, cache_position, attention_mask=None,
                              params: SuperlinearParams | None = None, scale: float | None = None,
                              return_search: bool = False):
    """One decode step: q ``[B, H_Q, 1, D]``, each row at ``cache_position[b]``; ``[B, H_Q, 1, D]``."""
    params = params or SuperlinearParams()
    batch, heads, _, dim = q2.shape
    kv_heads, key_len = k.shape[1], k.shape[2]
    group = heads // kv_heads
    topk = params.topk
    device = q2.device
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    positions = normalize_positions(cache_position, batch, 1, key_len, device)
    pos32 = positions[:, 0].to(torch.int32).contiguous()
    key_mask = normalize_key_mask(attention_mask, batch, key_len, device)
    start32 = key_start(key_mask, batch, key_len, device).to(torch.int32)
    geo = span_geometry(params, key_len, device, torch.int32)
    mask, stride_mb, has_mask = key_mask_arg(key_mask, q2)
    bd = block_dim(dim)
    q1s, q2s = q1[:, :, 0], q2[:, :, 0]

    anchor = torch.empty((batch, heads, topk), dtype=torch.int32, device=device)
    score = torch.empty((batch, heads, topk), dtype=torch.float32, device=device)
    _decode_search_kernel[(batch * heads,)](
        q1s, k, pos32, mask, geo.stripe_distance, geo.stripe_count, anchor, score,
        *q1s.stride(), *k.stride(), stride_mb, heads, group, dim,
        HAS_MASK=has_mask, TOPK=topk, KPAD=triton.next_power_of_2(topk),
        BLOCK_S=BLOCK_S, BLOCK_D=bd, num_warps=4,
    )

    # Static split sizes from the cache length: the longest possible span or window (read from the
    # host copy of the tables: no device synchronisation, so the step can be graph-captured).
    n_split, split = decode_splits(params, key_len)
    part_lse = torch.empty((batch * heads * (topk + 1) * n_split,), dtype=torch.float32, device=device)
    part_out = torch.empty((batch * heads * (topk + 1) * n_split, dim), dtype=torch.float32, device=device)
    _decode_span_kernel[(batch * heads, topk + 1, n_split)](
        q2s, k, v, pos32, start32, mask, anchor, geo.backward_len, geo.forward_len, part_lse, part_out,
        *q2s.stride(), *k.stride(), *v.stride(), stride_mb,
        heads, group, dim, geo.window, geo.max_len, split, n_split, scale,
        HAS_MASK=has_mask, TOPK=topk, BLOCK_K=BLOCK_K, BLOCK_D=bd, num_warps=4,
    )
    out = torch.empty((batch, heads, 1, dim), dtype=q2.dtype, device=device)
    out_s = out[:, :, 0]
    _decode_merge_kernel[(batch * heads,)](
        part_lse, part_out, anchor, score, out_s, *out_s.stride(), heads, dim, n_split,
        TOPK=topk, NS_PAD=max(2, triton.next_power_of_2(n_split)), BLOCK_D=bd, num_warps=4,
    )
    if return_search:
        return out, (anchor, score)
    return out
