"""Triton decode over a paged cache: one query per request, K/V read through the block table.

``decode.py``'s three launches with paged addressing (``paged_common.paged_offsets``):

1. ``_paged_decode_search_kernel`` (per (request, query head)): scores the stripe keys of position
   ``seq_len - 1`` block by block and keeps the exact top-k;
2. ``_paged_decode_span_kernel`` (per (request, query head, part, split)): parts 0..k-1 are the
   spans of the selected anchors, part k the window, each split in ``n_split`` key ranges;
3. ``decode._decode_merge_kernel`` (unchanged: it reads partials only).

Static: the grid and every buffer depend only on (R, H_Q, D, topk) and ``max_seq_len`` (which sizes
the span tables and the split count), never on ``seq_lens`` or the block table, which are read on
the device.  No host synchronisation, so the step can be captured in a CUDA graph; a request with
``seq_len == 0`` (graph padding) reads nothing and outputs 0.  The PyTorch reference is
``toolkit.kernels.superlinear.paged.superlinear_decode_paged`` with ``impl="gather"``.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..spans import span_geometry
from .common import block_dim
from .decode import BLOCK_K, BLOCK_S, SPLIT_KEYS, _decode_merge_kernel
from .paged_common import cache_args, paged_offsets
from .search import NO_ANCHOR_BASE


@triton.jit
def _paged_decode_search_kernel(
    Q, K, K_PERM, BT, REQ_ROW, SEQ_LEN, STRIPE, COUNT, ANCHOR, SCORE,
    stride_qb, stride_qh, stride_qd,
    stride_k_block, stride_k_head, stride_k_token, stride_k_dim,
    stride_bt,
    H, G, DIM,
    BLOCK_SIZE: tl.constexpr, K_HAS_PERM: tl.constexpr, TOPK: tl.constexpr, KPAD: tl.constexpr,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    b = pid // H
    h = pid % H
    kvh = h // G
    pos = tl.load(SEQ_LEN + b) - 1
    table_base = tl.load(REQ_ROW + b).to(tl.int64) * stride_bt
    d = tl.arange(0, BLOCK_D)
    d_ok = d < DIM
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + d * stride_qd,
                mask=d_ok, other=0.0).to(tl.float32)
    k_head = K + kvh.to(tl.int64) * stride_k_head
    slot = tl.arange(0, KPAD)
    ts = tl.where(slot < TOPK, float("-inf"), float("inf"))
    ta = NO_ANCHOR_BASE - slot
    n = tl.where(pos >= 0, tl.load(COUNT + tl.maximum(pos, 0)), 0)
    for j0 in range(0, n, BLOCK_S):
        js = j0 + tl.arange(0, BLOCK_S)
        ok = js < n
        a = pos + 1 - tl.load(STRIPE + js, mask=ok, other=0)
        ok = ok & (a >= 0)
        offs = paged_offsets(BT, table_base, a, ok, d, K_PERM, stride_k_block, stride_k_token, stride_k_dim,
                             DIM, BLOCK_SIZE, K_HAS_PERM)
        kr = tl.load(k_head + offs, mask=ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        s = tl.where(ok, tl.sum(q[None, :] * kr, 1), float("-inf"))
        # Move the block's k best into the set, one at a time (best of block, ties: farther anchor).
        for r in tl.static_range(TOPK):
            best = tl.max(s, 0)
            best_anchor = tl.min(tl.where(ok & (s == best), a, 2147483647), 0)
            worst = tl.min(ts, 0)
            worst_anchor = tl.max(tl.where(ts == worst, ta, -2147483647), 0)
            better = (best_anchor != 2147483647) & ((best > worst) | ((best == worst) & (best_anchor < worst_anchor)))
            replace = (ts == worst) & (ta == worst_anchor) & better
            ts = tl.where(replace, best, ts)
            ta = tl.where(replace, best_anchor, ta)
            taken = a == best_anchor
            ok = ok & (~taken)
            s = tl.where(taken, float("-inf"), s)
    found = ta >= 0
    out = pid.to(tl.int64) * TOPK + slot
    tl.store(ANCHOR + out, tl.where(found, ta, -1), mask=slot < TOPK)
    tl.store(SCORE + out, tl.where(found, ts, float("-inf")), mask=slot < TOPK)


@triton.jit
def _paged_decode_span_kernel(
    Q, K, V, K_PERM, V_PERM, BT, REQ_ROW, SEQ_LEN, ANCHOR, BACK, FWD, PART_LSE, PART_OUT,
    stride_qb, stride_qh, stride_qd,
    stride_k_block, stride_k_head, stride_k_token, stride_k_dim,
    stride_v_block, stride_v_head, stride_v_token, stride_v_dim,
    stride_bt,
    H, G, DIM, WINDOW, MAX_T, SPLIT, N_SPLIT, scale,
    BLOCK_SIZE: tl.constexpr, K_HAS_PERM: tl.constexpr, V_HAS_PERM: tl.constexpr,
    TOPK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    part = tl.program_id(1)
    split = tl.program_id(2)
    b = pid // H
    h = pid % H
    kvh = h // G
    pos = tl.load(SEQ_LEN + b) - 1
    table_base = tl.load(REQ_ROW + b).to(tl.int64) * stride_bt
    # Span of anchor `part` (exact integer tables; no left padding in a serving cache: s = 0), or
    # the window for part == TOPK.
    a = tl.load(ANCHOR + pid * TOPK + tl.minimum(part, TOPK - 1))
    a = tl.where(part < TOPK, a, -1)
    seen = tl.minimum(tl.maximum(pos + 1, 0), MAX_T)
    span_lo = tl.maximum(a - tl.load(BACK + seen), 0)
    span_hi = tl.minimum(a + tl.load(FWD + seen), pos - WINDOW)
    span_hi = tl.where(a >= 0, span_hi, span_lo - 1)
    lo = tl.where(part < TOPK, span_lo, tl.maximum(pos - WINDOW + 1, 0))
    hi = tl.where(part < TOPK, span_hi, pos)
    lo = lo + split * SPLIT
    hi = tl.minimum(hi, lo + SPLIT - 1)

    d = tl.arange(0, BLOCK_D)
    d_ok = d < DIM
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + d * stride_qd,
                mask=d_ok, other=0.0).to(tl.float32)
    k_head = K + kvh.to(tl.int64) * stride_k_head
    v_head = V + kvh.to(tl.int64) * stride_v_head
    m_i = tl.max(tl.full([BLOCK_K], float("-inf"), tl.float32), 0)  # fp32 scalars (loop-carried)
    l_i = tl.sum(tl.zeros([BLOCK_K], tl.float32), 0)
    acc = tl.zeros([BLOCK_D], tl.float32)
    for k0 in range(lo, hi + 1, BLOCK_K):
        kpos = k0 + tl.arange(0, BLOCK_K)
        k_ok = kpos <= hi
        kd_ok = k_ok[:, None] & d_ok[None, :]
        k_offs = paged_offsets(BT, table_base, kpos, k_ok, d, K_PERM, stride_k_block, stride_k_token,
                               stride_k_dim, DIM, BLOCK_SIZE, K_HAS_PERM)
        v_offs = paged_offsets(BT, table_base, kpos, k_ok, d, V_PERM, stride_v_block, stride_v_token,
                               stride_v_dim, DIM, BLOCK_SIZE, V_HAS_PERM)
        kt = tl.load(k_head + k_offs, mask=kd_ok, other=0.0).to(tl.float32)
        vt = tl.load(v_head + v_offs, mask=kd_ok, other=0.0).to(tl.float32)
        s = tl.where(k_ok, tl.sum(q[None, :] * kt, 1) * scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 0))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        p = tl.exp(s - m_use)
        alpha = tl.exp(m_i - m_use)
        l_i = l_i * alpha + tl.sum(p, 0)
        acc = acc * alpha + tl.sum(p[:, None] * vt, 0)
        m_i = m_new
    has = l_i > 0
    lse = tl.where(has, tl.where(m_i == float("-inf"), 0.0, m_i) + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    slot = (pid.to(tl.int64) * (TOPK + 1) + part) * N_SPLIT + split
    tl.store(PART_LSE + slot, lse)
    tl.store(PART_OUT + slot * DIM + d, acc / tl.where(has, l_i, 1.0), mask=d_ok)


def decode_splits(params, max_seq_len: int) -> tuple[int, int]:
    """(n_split, keys per split) for the longest span or window a query below ``max_seq_len`` can
    have: host tables only, so the grid is static."""
    host_geo = span_geometry(params, max_seq_len)
    longest = max(host_geo.max_span_len(max_seq_len), host_geo.window, 1)
    n_split = triton.cdiv(longest, SPLIT_KEYS)
    split = triton.cdiv(triton.cdiv(longest, n_split), BLOCK_K) * BLOCK_K
    return n_split, split


def triton_superlinear_decode_paged(q1: torch.Tensor, q2: torch.Tensor, kv, params, scale: float | None,
                                    out: torch.Tensor, max_seq_len: int) -> torch.Tensor:
    """``out[R, H_Q, D]``: one decode step per request (see ``paged.superlinear_decode_paged``)."""
    batch, heads, dim = q2.shape
    group = heads // kv.kv_heads
    topk = params.topk
    device = q2.device
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    if batch == 0:
        return out
    geo = span_geometry(params, max_seq_len, device, torch.int32)
    k, k_perm, *k_strides, k_has_perm = cache_args(kv, "key")
    v, v_perm, *v_strides, v_has_perm = cache_args(kv, "value")
    block_table = kv.block_table
    req_rows = kv.request_table_rows()
    seq_lens = kv.seq_lens.to(device=device, dtype=torch.int32)
    bd = block_dim(dim)

    anchor = torch.empty((batch, heads, topk), dtype=torch.int32, device=device)
    score = torch.empty((batch, heads, topk), dtype=torch.float32, device=device)
    _paged_decode_search_kernel[(batch * heads,)](
        q1, k, k_perm, block_table, req_rows, seq_lens, geo.stripe_distance, geo.stripe_count, anchor, score,
        *q1.stride(), *k_strides, block_table.stride(0), heads, group, dim,
        BLOCK_SIZE=kv.block_size, K_HAS_PERM=k_has_perm, TOPK=topk, KPAD=triton.next_power_of_2(topk),
        BLOCK_S=BLOCK_S, BLOCK_D=bd, num_warps=4,
    )
    n_split, split = decode_splits(params, max_seq_len)
    part_lse = torch.empty((batch * heads * (topk + 1) * n_split,), dtype=torch.float32, device=device)
    part_out = torch.empty((batch * heads * (topk + 1) * n_split, dim), dtype=torch.float32, device=device)
    _paged_decode_span_kernel[(batch * heads, topk + 1, n_split)](
        q2, k, v, k_perm, v_perm, block_table, req_rows, seq_lens, anchor, geo.backward_len, geo.forward_len,
        part_lse, part_out,
        *q2.stride(), *k_strides, *v_strides, block_table.stride(0),
        heads, group, dim, geo.window, geo.max_len, split, n_split, scale,
        BLOCK_SIZE=kv.block_size, K_HAS_PERM=k_has_perm, V_HAS_PERM=v_has_perm,
        TOPK=topk, BLOCK_K=BLOCK_K, BLOCK_D=bd, num_warps=4,
    )
    _decode_merge_kernel[(batch * heads,)](
        part_lse, part_out, anchor, score, out, *out.stride(), heads, dim, n_split,
        TOPK=topk, NS_PAD=max(2, triton.next_power_of_2(n_split)), BLOCK_D=bd, num_warps=4,
    )
    return out
