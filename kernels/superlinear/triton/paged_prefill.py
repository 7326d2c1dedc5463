"""Triton superlinear attention of a ragged serving batch, reading K/V through the block table.

The batch is the flattened query rows of R requests (prompts, prefill chunks over a cached prefix,
single tokens); nothing is copied out of the cache.  Three launches plus a few torch ops, no host
synchronisation:

1. ``_paged_search_kernel`` (per KV head and block of rows, all G query heads of the group): the
   stripe keys of each row are looked up through that row's request's block table;
2. span bounds from the shared integer tables (torch); each query gets ``k + 1`` key ranges: its k
   spans and, as slot k, its window;
3. ``_paged_span_tile_kernel``: every (query, range) pair is grouped by ``tiling`` into tiles of one
   (request, KV head) whose ranges start in the same logical key block; a program walks the tile's
   footprint block by block (each key's physical address from the block table) with tile matmuls
   and writes (lse, output) partials per pair;
4. ``_paged_merge_kernel``: each span merged with the window by log-sum-exp, gated by the softmax
   of the search scores, written straight into the engine's ``[T, H_Q, D]`` output.

The plain PyTorch reference of the same computation is ``toolkit.kernels.superlinear.paged`` with
``impl="gather"`` (reads each request's prefix, then ``gather/``).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from ..attention_spans import span_bounds, span_geometry
from ..tiling import build_span_tiles
from .jit_helpers import (
    block_dim,
    dot_precision,
    empty_softmax,
    empty_topk,
    gate_rows,
    group_rows,
    insert_group_candidates,
    interpreting,
    masked_tile_step,
    row_block,
    store_pair_partials,
    store_topk,
    tile_pairs,
)
from .paged_common import load_paged_rows, paged_cache, stripe_search
from .prefill import _canonical_order


@triton.jit
def _paged_search_kernel(
    SEARCH, K, BT, TOKEN_ROW, POS, stride_bt, T, G, DIM,
    GP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # Rows r = g * BLOCK_Q + i: query head kvh * G + g of token i of the block (as search.py); the
    # tokens of a block may belong to different requests, so each has its own block-table row.
    kvh = tl.program_id(0)
    pid_q = tl.program_id(1)
    i = tl.arange(0, BLOCK_Q)
    tokens = pid_q * BLOCK_Q + i
    t_ok = tokens < T
    qpos = tl.load(POS + tokens, mask=t_ok, other=-1)
    table_base = tl.load(TOKEN_ROW + tokens, mask=t_ok, other=0).to(tl.int64) * stride_bt
    rows, row_ok, h, d, d_ok = group_rows(pid_q, kvh, T, G, DIM, GP, BLOCK_Q, BLOCK_D)
    q = tl.load(SEARCH.q + rows[:, None].to(tl.int64) * SEARCH.stride_row
                + h[:, None].to(tl.int64) * SEARCH.stride_head + d[None, :] * SEARCH.stride_dim,
                mask=row_ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
    k_head = K.data + kvh.to(tl.int64) * K.stride_head

    slot, ts, ta = empty_topk(GP * BLOCK_Q, SEARCH.topk_pad, SEARCH.topk)
    n = tl.load(SEARCH.stripe_count + tl.max(tl.maximum(qpos, 0), 0))
    for j in range(0, n):
        a_q = qpos + 1 - tl.load(SEARCH.stripe_distance + j)
        ok_q = t_ok & (a_q >= 0)
        kr = load_paged_rows(K, k_head, BT, table_base, a_q, ok_q, d, d_ok, DIM).to(tl.float32)
        ts, ta = insert_group_candidates(ts, ta, q, kr, a_q, ok_q, row_ok, GP, BLOCK_Q, BLOCK_D)

    out = (h[:, None].to(tl.int64) * T + rows[:, None]) * SEARCH.topk + slot[None, :]
    store_topk(SEARCH.anchor, SEARCH.score, out, row_ok[:, None] & (slot[None, :] < SEARCH.topk), ts, ta)


@triton.jit
def _paged_span_tile_kernel(
    Q, K, V, BT, REQ_ROW, SEQ_LEN, PAIR_IDS, TILE_GROUP, TILE_FIRST, TILE_NBLK, SPAN_LO, SPAN_HI, LSE, OUT,
    stride_qt, stride_qh, stride_qd, stride_bt, T, KP, HKV, DIM, scale,
    TILE: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    nblk, first, req, kvh, ids, ok, lo, hi = tile_pairs(PAIR_IDS, TILE_GROUP, TILE_FIRST, TILE_NBLK, SPAN_LO,
                                                        SPAN_HI, tl.program_id(0), HKV, TILE)
    table_base = tl.load(REQ_ROW + req).to(tl.int64) * stride_bt
    seq_len = tl.load(SEQ_LEN + req)
    row = ids // KP  # pair id = (h * T + token) * KP + range
    token = row % T
    h = row // T
    d = tl.arange(0, BLOCK_D)
    d_ok = d < DIM
    q = tl.load(Q + token[:, None].to(tl.int64) * stride_qt + h[:, None].to(tl.int64) * stride_qh
                + d[None, :] * stride_qd, mask=ok[:, None] & d_ok[None, :], other=0.0)
    k_head = K.data + kvh.to(tl.int64) * K.stride_head
    v_head = V.data + kvh.to(tl.int64) * V.stride_head

    m_i, l_i, acc = empty_softmax(TILE, BLOCK_D)
    for blk in range(0, nblk):
        kpos = (first + blk) * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = kpos < seq_len
        kt = load_paged_rows(K, k_head, BT, table_base, kpos, k_ok, d, d_ok, DIM).to(q.dtype)
        vt = load_paged_rows(V, v_head, BT, table_base, kpos, k_ok, d, d_ok, DIM).to(q.dtype)
        m_i, l_i, acc = masked_tile_step(m_i, l_i, acc, q, kt, vt, kpos, k_ok, lo, hi, scale, DOT_PRECISION)
    store_pair_partials(LSE, OUT, ids, ok, d, d_ok, DIM, m_i, l_i, acc)


@triton.jit
def _paged_merge_kernel(
    LSE, PART_OUT, ANCHOR, SCORE, OUT,
    stride_ot, stride_oh, stride_od,
    T, DIM,
    TOPK: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # Partials per query: slots 0..TOPK-1 are its spans, slot TOPK its window (merge.py's layout
    # with the window folded in).
    h = tl.program_id(0)
    rows, row_ok, d, d_ok = row_block(tl.program_id(1), T, DIM, BLOCK_Q, BLOCK_D)
    io_mask = row_ok[:, None] & d_ok[None, :]
    idx = h.to(tl.int64) * T + rows
    win = idx * (TOPK + 1) + TOPK
    win_lse = tl.load(LSE + win, mask=row_ok, other=float("-inf"))
    win_out = tl.load(PART_OUT + win[:, None] * DIM + d[None, :], mask=io_mask, other=0.0)
    out = gate_rows(ANCHOR, SCORE, LSE, PART_OUT, idx, TOPK + 1, row_ok, d, io_mask, win_lse, win_out, DIM,
                    TOPK, BLOCK_Q, BLOCK_D)
    tl.store(OUT + rows[:, None].to(tl.int64) * stride_ot + h.to(tl.int64) * stride_oh + d[None, :] * stride_od,
             out.to(OUT.dtype.element_ty), mask=io_mask)


def token_metadata(query_start: torch.Tensor, seq_lens: torch.Tensor, num_tokens: int):
    """Request (int64) and absolute position (int64, -1 for padding rows) of each query row; device ops."""
    device = seq_lens.device
    qs = query_start.to(device=device, dtype=torch.int64)
    num_requests = qs.numel() - 1
    tokens = torch.arange(num_tokens, device=device)
    req = torch.searchsorted(qs[1:].contiguous(), tokens, right=True).clamp(max=max(num_requests - 1, 0))
    pos = seq_lens.to(device=device, dtype=torch.int64)[req] - (qs[1:][req] - tokens)
    real = (tokens < qs[-1]) & (tokens >= qs[0]) & (pos >= 0)
    return req, torch.where(real, pos, -1)


def tile_config(dim: int) -> tuple[int, int]:
    """(pairs per tile, keys per block); the interpreter runs each program step in Python: bigger."""
    if interpreting():
        return 128, 64
    return (64, 64) if block_dim(dim) <= 128 else (32, 32)


def triton_superlinear_attention_paged(q1: torch.Tensor, q2: torch.Tensor, kv, query_start: torch.Tensor,
                                       params, scale: float | None, out: torch.Tensor) -> torch.Tensor:
    """``out[T, H_Q, D]`` = superlinear attention of the ragged batch (see ``paged.superlinear_attention_paged``)."""
    num_tokens, heads, dim = q2.shape
    kv_heads = kv.kv_heads
    group = heads // kv_heads
    topk = params.topk
    num_requests = kv.num_requests
    device = q2.device
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    if num_tokens == 0 or num_requests == 0:
        return out.zero_()
    max_len = kv.capacity
    geo64 = span_geometry(params, max_len, device)
    geo32 = span_geometry(params, max_len, device, torch.int32)
    req, pos = token_metadata(query_start, kv.seq_lens, num_tokens)
    req_rows = kv.request_table_rows()
    token_rows = req_rows[req].contiguous()
    pos32 = pos.to(torch.int32).contiguous()
    k = paged_cache(kv, "key")
    v = paged_cache(kv, "value")
    block_table = kv.block_table
    bd = block_dim(dim)

    # 1. search
    search = stripe_search(q1, geo32, (heads, num_tokens), topk)
    gp = triton.next_power_of_2(group)
    rows_per_program = 512 if interpreting() else (128 if bd <= 64 else 64)
    block_q = max(16, rows_per_program // gp)
    _paged_search_kernel[(kv_heads, triton.cdiv(num_tokens, block_q))](
        search, k, block_table, token_rows, pos32, block_table.stride(0), num_tokens, group, dim,
        GP=gp, BLOCK_Q=block_q, BLOCK_D=bd, num_warps=4,
    )
    anchor, score = _canonical_order(search.anchor.long()[None], search.score[None], max_len)  # [1, H, T, k]

    # 2. key ranges: k spans, then the window, per (head, token)
    positions = pos[None]  # [1, T]
    span_lo, span_hi = span_bounds(anchor, positions, torch.zeros(1, dtype=torch.int64, device=device), geo64)
    window = geo64.window
    win_lo = (pos - window + 1).clamp(min=0).expand(heads, num_tokens)
    win_hi = (pos if window > 0 else torch.full_like(pos, -1)).expand(heads, num_tokens)
    range_lo = torch.cat([span_lo[0], win_lo[..., None]], dim=-1).reshape(-1)  # [(h * T + t) * (k+1) + j]
    range_hi = torch.cat([span_hi[0], win_hi[..., None]], dim=-1).reshape(-1)

    # 3. partials of every (query, range) pair, tiled per (request, KV head)
    kp = topk + 1
    tile_pairs, block_k = tile_config(dim)
    pair = torch.arange(heads * num_tokens * kp, device=device)
    pair_token = (pair // kp) % num_tokens
    pair_head = pair // (num_tokens * kp)
    pair_group = req[pair_token] * kv_heads + pair_head // group
    tiles = build_span_tiles(range_lo, range_hi, pair_group, num_requests * kv_heads, max_len, block_k, tile_pairs)
    num_pairs = pair.numel()
    lse = torch.full((num_pairs,), float("-inf"), dtype=torch.float32, device=device)
    part_out = torch.zeros((num_pairs, dim), dtype=torch.float32, device=device)
    seq_lens32 = kv.seq_lens.to(device=device, dtype=torch.int32)
    _paged_span_tile_kernel[(tiles.pair_ids.shape[0],)](
        q2, k, v, block_table, req_rows, seq_lens32, tiles.pair_ids, tiles.group, tiles.first_block, tiles.num_blocks,
        range_lo.to(torch.int32), range_hi.to(torch.int32), lse, part_out,
        *q2.stride(), block_table.stride(0), num_tokens, kp, kv_heads, dim, scale,
        TILE=tile_pairs, BLOCK_K=block_k, BLOCK_D=bd, DOT_PRECISION=dot_precision(q2.dtype),
        num_warps=4 if bd <= 64 else 8,
    )

    # 4. merge and gate into the engine's output
    merge_rows = 256 if interpreting() else 32
    _paged_merge_kernel[(heads, triton.cdiv(num_tokens, merge_rows))](
        lse, part_out, anchor.to(torch.int32).contiguous(), score.contiguous(), out,
        *out.stride(), num_tokens, dim,
        TOPK=topk, BLOCK_Q=merge_rows, BLOCK_D=bd, num_warps=4,
    )
    return out
