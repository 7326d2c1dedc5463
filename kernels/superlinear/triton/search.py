"""Triton search: top-k stripe anchors per (batch, query head, query).

One program per (batch, KV head, block of queries), for all the query heads of the GQA group.  It
walks the stripes nearest first; on stripe j the anchors of consecutive queries are consecutive
key rows (``pos + 1 - F(j)``), so each step is one coalesced ``[BLOCK_Q, D]`` load, shared by the
group's query heads, and row-wise dot products with Q1 in fp32.  The top-k
is kept as an unsorted set of k (score, anchor) slots per query: a candidate replaces the set's
worst entry when it is better, with the total order of ``attention_spans.ordered_score_key`` (higher score;
on equal scores the farther, i.e. smaller, anchor).  The order inside the set is fixed on the host.
K is never repeated; each K row is read once per group instead of once per query head.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .jit_helpers import (
    block_dim,
    empty_topk,
    group_rows,
    insert_group_candidates,
    interpreting,
    key_mask_arg,
    store_topk,
)


@triton.jit
def _search_kernel(
    Q, K, POS, KEY_MASK, STRIPE, COUNT, ANCHOR, SCORE,
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_kb, stride_kh, stride_kl, stride_kd,
    stride_pb, stride_mb,
    H, HKV, G, LQ, DIM,
    HAS_MASK: tl.constexpr, TOPK: tl.constexpr, KPAD: tl.constexpr,
    GP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program: BLOCK_Q queries of one batch row for all G query heads of one KV head.  Row
    # r = g * BLOCK_Q + i is (query head kvh * G + g, query i): each stripe's K rows are loaded once
    # for the whole group (GP = G rounded up to a power of two; extra rows are masked).
    pid_bk = tl.program_id(0)
    pid_q = tl.program_id(1)
    b = pid_bk // HKV
    kvh = pid_bk % HKV
    i = tl.arange(0, BLOCK_Q)
    qrows = pid_q * BLOCK_Q + i
    q_ok = qrows < LQ
    qpos = tl.load(POS + b * stride_pb + qrows, mask=q_ok, other=-1)
    rows, row_ok, h, d, d_ok = group_rows(pid_q, kvh, LQ, G, DIM, GP, BLOCK_Q, BLOCK_D)
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h[:, None].to(tl.int64) * stride_qh
                + rows[:, None].to(tl.int64) * stride_ql + d[None, :] * stride_qd,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    k_ptr = K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh

    slot, ts, ta = empty_topk(GP * BLOCK_Q, KPAD, TOPK)
    n = tl.load(COUNT + tl.max(qpos, 0))
    for j in range(0, n):
        dist = tl.load(STRIPE + j)
        a_q = qpos + 1 - dist
        ok_q = q_ok & (a_q >= 0)
        if HAS_MASK:
            ok_q = ok_q & (tl.load(KEY_MASK + b * stride_mb + a_q, mask=ok_q, other=0) != 0)
        kr = tl.load(k_ptr + a_q[:, None].to(tl.int64) * stride_kl + d[None, :] * stride_kd,
                     mask=ok_q[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
        ts, ta = insert_group_candidates(ts, ta, q, kr, a_q, ok_q, row_ok, GP, BLOCK_Q, BLOCK_D)

    out = ((b * H + h[:, None]).to(tl.int64) * LQ + rows[:, None]) * TOPK + slot[None, :]
    store_topk(ANCHOR, SCORE, out, row_ok[:, None] & (slot[None, :] < TOPK), ts, ta)


def search(q1: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, key_mask: torch.Tensor | None,
           stripe_distance: torch.Tensor, stripe_count: torch.Tensor, topk: int,
           rows_per_program: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Unsorted top-k: anchors int32 ``[B, H_Q, L_Q, k]`` (-1 = none), scores fp32 (-inf = none).

    positions: int32 ``[B, L_Q]`` contiguous; stripe tables int32 on the device.
    """
    batch, heads, query_len, dim = q1.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    anchor = torch.empty((batch, heads, query_len, topk), dtype=torch.int32, device=q1.device)
    score = torch.empty((batch, heads, query_len, topk), dtype=torch.float32, device=q1.device)
    if query_len == 0:
        return anchor, score
    mask, stride_mb, has_mask = key_mask_arg(key_mask, q1)
    gp = triton.next_power_of_2(group)
    if rows_per_program is None:
        rows_per_program = 512 if interpreting() else (128 if block_dim(dim) <= 64 else 64)
    block_q = max(16, rows_per_program // gp)
    grid = (batch * kv_heads, triton.cdiv(query_len, block_q))
    _search_kernel[grid](
        q1, k, positions, mask, stripe_distance, stripe_count, anchor, score,
        *q1.stride(), *k.stride(), positions.stride(0), stride_mb,
        heads, kv_heads, group, query_len, dim,
        HAS_MASK=has_mask, TOPK=topk, KPAD=triton.next_power_of_2(topk),
        GP=gp, BLOCK_Q=block_q, BLOCK_D=block_dim(dim), num_warps=4,
    )
    return anchor, score
