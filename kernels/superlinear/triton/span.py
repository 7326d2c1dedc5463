"""Triton span attention: softmax partials of every (query, span) pair over its span.

Pairs are grouped by ``toolkit.kernels.superlinear.tiling`` into tiles of up to ``TILE`` pairs of one
(batch row, KV head) whose spans start in the same key block, so one program loads each key block
of the tile's footprint once and runs ``[TILE, D] x [D, BLOCK_K]`` tile matmuls for all its pairs
(the rows may belong to different query heads of the GQA group and to different queries).  Each
row is masked to its own ``[span_start, span_end]`` and to the key mask.  The window is not
included: it is merged later (``merge.py``).  The loop length is the tile's footprint, read at run
time, so there is no static bound on span length and no recompilation per length.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .jit_helpers import (
    block_dim,
    dot_precision,
    empty_softmax,
    interpreting,
    key_mask_arg,
    load_key_block,
    masked_tile_step,
    store_pair_partials,
    tile_pairs,
)


@triton.jit
def _span_tile_kernel(
    Q, K, V, KEY_MASK, PAIR_IDS, TILE_GROUP, TILE_FIRST, TILE_NBLK, SPAN_LO, SPAN_HI, LSE, OUT,
    stride_qb, stride_qh, stride_ql, stride_qd,
    stride_kb, stride_kh, stride_kl, stride_kd,
    stride_vb, stride_vh, stride_vl, stride_vd,
    stride_mb,
    H, LQ, TOPK, HKV, DIM, LKV, scale,
    HAS_MASK: tl.constexpr, TILE: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    nblk, first, b, kvh, ids, ok, lo, hi = tile_pairs(PAIR_IDS, TILE_GROUP, TILE_FIRST, TILE_NBLK, SPAN_LO, SPAN_HI,
                                                      tl.program_id(0), HKV, TILE)
    row = ids // TOPK  # pair id = ((b * H + h) * LQ + query) * TOPK + span
    query = row % LQ
    h = (row // LQ) % H
    d = tl.arange(0, BLOCK_D)
    d_ok = d < DIM
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h[:, None].to(tl.int64) * stride_qh
                + query[:, None].to(tl.int64) * stride_ql + d[None, :] * stride_qd,
                mask=ok[:, None] & d_ok[None, :], other=0.0)
    k_ptr = K + b.to(tl.int64) * stride_kb + kvh.to(tl.int64) * stride_kh
    v_ptr = V + b.to(tl.int64) * stride_vb + kvh.to(tl.int64) * stride_vh

    m_i, l_i, acc = empty_softmax(TILE, BLOCK_D)
    for blk in range(0, nblk):
        kpos = (first + blk) * BLOCK_K + tl.arange(0, BLOCK_K)
        k_ok = kpos < LKV
        k_ok, kt, vt = load_key_block(k_ptr, v_ptr, KEY_MASK + b * stride_mb, kpos, k_ok, d, d_ok,
                                      stride_kl, stride_kd, stride_vl, stride_vd, HAS_MASK)
        m_i, l_i, acc = masked_tile_step(m_i, l_i, acc, q, kt, vt, kpos, k_ok, lo, hi, scale, DOT_PRECISION)
    store_pair_partials(LSE, OUT, ids, ok, d, d_ok, DIM, m_i, l_i, acc)


def tile_config(dim: int) -> tuple[int, int]:
    """(pairs per tile, keys per block) for a head dim: smaller tiles for wide heads (registers).

    The interpreter runs each program step in Python: bigger tiles there mean fewer steps.
    """
    if interpreting():
        return 128, 128
    return (64, 64) if block_dim(dim) <= 128 else (32, 32)


def span_partials(q2: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None,
                  tiles, span_lo: torch.Tensor, span_hi: torch.Tensor, scale: float,
                  block_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """lse ``[P]`` and normalised output ``[P, D]`` (fp32) of each pair; pairs in no tile stay -inf/0.

    span_lo/hi: int32 flat ``[P]`` in pair-id order ``((b * H + h) * L_Q + query) * k + span``.
    """
    batch, heads, query_len, dim = q2.shape
    num_pairs = span_lo.numel()
    topk = num_pairs // max(1, batch * heads * query_len)
    lse = torch.full((num_pairs,), float("-inf"), dtype=torch.float32, device=q2.device)
    out = torch.zeros((num_pairs, dim), dtype=torch.float32, device=q2.device)
    n_tiles = tiles.pair_ids.shape[0]
    if num_pairs == 0 or n_tiles == 0:
        return lse, out
    mask, stride_mb, has_mask = key_mask_arg(key_mask, q2)
    bd = block_dim(dim)
    _span_tile_kernel[(n_tiles,)](
        q2, k, v, mask, tiles.pair_ids, tiles.group, tiles.first_block, tiles.num_blocks,
        span_lo, span_hi, lse, out,
        *q2.stride(), *k.stride(), *v.stride(), stride_mb,
        heads, query_len, topk, k.shape[1], dim, k.shape[2], scale,
        HAS_MASK=has_mask, TILE=tiles.tile_size, BLOCK_K=block_k, BLOCK_D=bd,
        DOT_PRECISION=dot_precision(q2.dtype), num_warps=4 if bd <= 64 else 8,
    )
    return lse, out
