"""Triton merge and gate: out = sum_j g_j * attention(span_j U window), g = softmax(search scores).

Each span's partials (lse_j, o_j) are merged with the window's (lse_w, o_w) by log-sum-exp:
``O_j = (e^lse_j o_j + e^lse_w o_w) / (e^lse_j + e^lse_w)``; the gate is the softmax of the
search scores over the valid spans.  A query with no valid span gets the window alone (the
published gate becomes uniform then, with the same result); one with no key at all gets 0.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .jit_helpers import block_dim, gate_rows, interpreting, row_block


@triton.jit
def _merge_kernel(
    WIN_LSE, WIN_OUT, SPAN_LSE, SPAN_OUT, ANCHOR, SCORE, OUT,
    stride_ob, stride_oh, stride_ol, stride_od,
    H, LQ, DIM,
    TOPK: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid_bh = tl.program_id(0)
    rows, row_ok, d, d_ok = row_block(tl.program_id(1), LQ, DIM, BLOCK_Q, BLOCK_D)
    io_mask = row_ok[:, None] & d_ok[None, :]
    idx = pid_bh.to(tl.int64) * LQ + rows
    win_lse = tl.load(WIN_LSE + idx, mask=row_ok, other=float("-inf"))
    win_out = tl.load(WIN_OUT + idx[:, None] * DIM + d[None, :], mask=io_mask, other=0.0)
    out = gate_rows(ANCHOR, SCORE, SPAN_LSE, SPAN_OUT, idx, TOPK, row_ok, d, io_mask, win_lse, win_out, DIM,
                    TOPK, BLOCK_Q, BLOCK_D)
    b = pid_bh // H
    h = pid_bh % H
    tl.store(OUT + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
             + rows[:, None].to(tl.int64) * stride_ol + d[None, :] * stride_od,
             out.to(OUT.dtype.element_ty), mask=io_mask)


def merge_and_gate(win_lse, win_out, span_lse, span_out, anchor, score, out: torch.Tensor,
                   block_q: int | None = None) -> torch.Tensor:
    """Writes ``[B, H_Q, L_Q, D]`` into ``out`` (any strides, any float dtype)."""
    batch, heads, query_len, dim = out.shape
    if query_len == 0:
        return out
    topk = anchor.shape[-1]
    if block_q is None:
        block_q = 256 if interpreting() else 32
    grid = (batch * heads, triton.cdiv(query_len, block_q))
    _merge_kernel[grid](
        win_lse, win_out, span_lse, span_out, anchor, score, out,
        *out.stride(), heads, query_len, dim,
        TOPK=topk, BLOCK_Q=block_q, BLOCK_D=block_dim(dim), num_warps=4,
    )
    return out
