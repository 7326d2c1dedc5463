"""Triton sliding window: softmax partials of each query over keys ``[q - W + 1, q]``.

Computed once per query (not once per span) and merged into every span afterwards by log-sum-exp.
One program per (batch, query head, block of queries); it walks the key blocks between the block's
lowest ``q - W + 1`` and highest ``q`` (BLOCK_Q + W keys for contiguous positions) with tile
matmuls and a band mask.  QK^T and PV accumulate in fp32; for fp32 inputs the products are exact
fp32 too (no bf16 rounding as in the published window kernel).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .jit_helpers import (
    block_dim,
    dot_precision,
    empty_softmax,
    finish_softmax,
    interpreting,
    key_mask_arg,
    load_key_block,
    online_softmax_step,
    row_block,
)


@triton.jit
def _window_kernel(
    Q, K, V, POS, KEY_MASK, LSE, OUT,
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_kb, stride_kh, stride_kl, stride_kd,
    stride_vb, stride_vh, stride_vl, stride_vd,
    stride_pb, stride_mb,
    H, G, LQ, DIM, WINDOW, scale,
    HAS_MASK: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    pid_q = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    kvh = h // G
    rows, row_ok, d, d_ok = row_block(pid_q, LQ, DIM, BLOCK_Q, BLOCK_D)
    pos = tl.load(POS + b * stride_pb + rows, mask=row_ok, other=0)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh
                + rows[:, None].to(tl.int64) * stride_ql + d[None, :] * stride_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    k_ptr = K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh
    v_ptr = V + b.to(tl.int64) * stride_vb + kvh.to(tl.int64) * stride_vh

    m_i, l_i, acc = empty_softmax(BLOCK_Q, BLOCK_D)
    lowest = tl.maximum(tl.min(tl.where(row_ok, pos, 2147483647), 0) - WINDOW + 1, 0)
    highest = tl.max(tl.where(row_ok, pos, -1), 0)
    if WINDOW == 0:
        highest = -1
    for start in range(lowest // BLOCK_K * BLOCK_K, highest + 1, BLOCK_K):
        kpos = start + tl.arange(0, BLOCK_K)
        k_ok = kpos <= highest
        k_ok, kt, vt = load_key_block(k_ptr, v_ptr, KEY_MASK + b * stride_mb, kpos, k_ok, d, d_ok,
                                      stride_kl, stride_kd, stride_vl, stride_vd, HAS_MASK)
        s = tl.dot(q, tl.trans(kt), input_precision=DOT_PRECISION) * scale
        allowed = (k_ok[None, :] & (kpos[None, :] <= pos[:, None])
                   & (kpos[None, :] > pos[:, None] - WINDOW) & row_ok[:, None])
        s = tl.where(allowed, s, float("-inf"))
        m_i, l_i, acc = online_softmax_step(m_i, l_i, acc, s, vt, DOT_PRECISION)
    lse, out = finish_softmax(m_i, l_i, acc)
    idx = pid_bh.to(tl.int64) * LQ + rows
    tl.store(LSE + idx, lse, mask=row_ok)
    tl.store(OUT + idx[:, None] * DIM + d[None, :], out, mask=row_ok[:, None] & d_ok[None, :])


def window_partials(q2: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                    key_mask: torch.Tensor | None, window: int, scale: float,
                    block_q: int | None = None, block_k: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """lse fp32 ``[B, H_Q, L_Q]`` and normalised output fp32 ``[B, H_Q, L_Q, D]`` of the window."""
    batch, heads, query_len, dim = q2.shape
    group = heads // k.shape[1]
    lse = torch.empty((batch, heads, query_len), dtype=torch.float32, device=q2.device)
    out = torch.empty((batch, heads, query_len, dim), dtype=torch.float32, device=q2.device)
    if query_len == 0:
        return lse, out
    mask, stride_mb, has_mask = key_mask_arg(key_mask, q2)
    bd = block_dim(dim)
    if block_q is None:
        block_q = 128 if interpreting() else 64
    if bd > 128 and not interpreting():
        block_q = block_k = 32
    grid = (batch * heads, triton.cdiv(query_len, block_q))
    _window_kernel[grid](
        q2, k, v, positions, mask, lse, out,
        *q2.stride(), *k.stride(), *v.stride(), positions.stride(0), stride_mb,
        heads, group, query_len, dim, window, scale,
        HAS_MASK=has_mask, BLOCK_Q=block_q, BLOCK_K=block_k, BLOCK_D=bd,
        DOT_PRECISION=dot_precision(q2.dtype), num_warps=4 if bd <= 64 else 8,
    )
    return lse, out
