"""Triton decode over a paged cache: one query per request, K/V read through the block table.

``decode.py``'s three launches with paged addressing (``paged_common``):

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

from ..attention_spans import span_geometry
from .jit_helpers import (
    block_dim,
    decode_part_range,
    empty_row_softmax,
    empty_topk_row,
    insert_block_best,
    load_query_row,
    row_softmax_step,
    store_split_partial,
    store_topk,
    stripe_block,
)
from .decode import BLOCK_K, BLOCK_S, _decode_merge_kernel, decode_splits
from .paged_common import decode_request, load_paged_rows, paged_cache, stripe_search


@triton.jit
def _paged_decode_search_kernel(
    SEARCH, K, BT, REQ_ROW, SEQ_LEN, stride_bt, H, G, DIM, BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    b, h, kvh, pos, table_base = decode_request(SEQ_LEN, REQ_ROW, stride_bt, pid, H, G)
    q, d, d_ok = load_query_row(SEARCH.q, b, h, SEARCH.stride_row, SEARCH.stride_head, SEARCH.stride_dim, DIM,
                                BLOCK_D)
    k_head = K.data + kvh.to(tl.int64) * K.stride_head
    slot, ts, ta = empty_topk_row(SEARCH.topk_pad, SEARCH.topk)
    n = tl.where(pos >= 0, tl.load(SEARCH.stripe_count + tl.maximum(pos, 0)), 0)
    for j0 in range(0, n, BLOCK_S):
        a, ok = stripe_block(SEARCH.stripe_distance, pos, j0, n, BLOCK_S)
        kr = load_paged_rows(K, k_head, BT, table_base, a, ok, d, d_ok, DIM).to(tl.float32)
        ts, ta = insert_block_best(ts, ta, q, kr, a, ok, SEARCH.topk)
    store_topk(SEARCH.anchor, SEARCH.score, pid.to(tl.int64) * SEARCH.topk + slot, slot < SEARCH.topk, ts, ta)


@triton.jit
def _paged_decode_span_kernel(
    Q, K, V, BT, REQ_ROW, SEQ_LEN, ANCHOR, BACK, FWD, PART_LSE, PART_OUT,
    stride_qb, stride_qh, stride_qd, stride_bt,
    H, G, DIM, WINDOW, MAX_T, SPLIT, N_SPLIT, scale,
    TOPK: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
):
    pid = tl.program_id(0)
    part = tl.program_id(1)
    split = tl.program_id(2)
    b, h, kvh, pos, table_base = decode_request(SEQ_LEN, REQ_ROW, stride_bt, pid, H, G)
    # No left padding in a serving cache: the first real key is 0.
    lo, hi = decode_part_range(ANCHOR, BACK, FWD, pid, part, split, pos, 0, WINDOW, MAX_T, SPLIT, TOPK)
    q, d, d_ok = load_query_row(Q, b, h, stride_qb, stride_qh, stride_qd, DIM, BLOCK_D)
    k_head = K.data + kvh.to(tl.int64) * K.stride_head
    v_head = V.data + kvh.to(tl.int64) * V.stride_head
    m_i, l_i, acc = empty_row_softmax(BLOCK_K, BLOCK_D)
    for k0 in range(lo, hi + 1, BLOCK_K):
        kpos = k0 + tl.arange(0, BLOCK_K)
        k_ok = kpos <= hi
        kt = load_paged_rows(K, k_head, BT, table_base, kpos, k_ok, d, d_ok, DIM).to(tl.float32)
        vt = load_paged_rows(V, v_head, BT, table_base, kpos, k_ok, d, d_ok, DIM).to(tl.float32)
        m_i, l_i, acc = row_softmax_step(m_i, l_i, acc, q, kt, vt, k_ok, scale)
    store_split_partial(PART_LSE, PART_OUT, pid, part, split, N_SPLIT, DIM, d, d_ok, m_i, l_i, acc, TOPK)


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
    k = paged_cache(kv, "key")
    v = paged_cache(kv, "value")
    block_table = kv.block_table
    req_rows = kv.request_table_rows()
    seq_lens = kv.seq_lens.to(device=device, dtype=torch.int32)
    bd = block_dim(dim)

    search = stripe_search(q1, geo, (batch, heads), topk)
    _paged_decode_search_kernel[(batch * heads,)](
        search, k, block_table, req_rows, seq_lens, block_table.stride(0), heads, group, dim,
        BLOCK_S=BLOCK_S, BLOCK_D=bd, num_warps=4,
    )
    anchor, score = search.anchor, search.score
    n_split, split = decode_splits(params, max_seq_len)
    part_lse = torch.empty((batch * heads * (topk + 1) * n_split,), dtype=torch.float32, device=device)
    part_out = torch.empty((batch * heads * (topk + 1) * n_split, dim), dtype=torch.float32, device=device)
    _paged_decode_span_kernel[(batch * heads, topk + 1, n_split)](
        q2, k, v, block_table, req_rows, seq_lens, anchor, geo.backward_len, geo.forward_len, part_lse, part_out,
        *q2.stride(), block_table.stride(0), heads, group, dim, geo.window, geo.max_len, split, n_split, scale,
        TOPK=topk, BLOCK_K=BLOCK_K, BLOCK_D=bd, num_warps=4,
    )
    _decode_merge_kernel[(batch * heads,)](
        part_lse, part_out, anchor, score, out, *out.stride(), heads, dim, n_split,
        TOPK=topk, NS_PAD=max(2, triton.next_power_of_2(n_split)), BLOCK_D=bd, num_warps=4,
    )
    return out
