"""Addressing K/V inside a paged cache from Triton: logical key position -> element offset.

A key at logical position ``p`` of a request lives in block ``block_table[row, p // block_size]``
at token ``p % block_size``; inside the (block, head) its D elements sit at ``t * stride_token +
d * stride_dim`` (strided layouts: row-major, transposed) or at ``perm[t * D + d]`` (any other
permutation of the block, read from a small table that stays in cache).  ``block_size`` is a
``constexpr`` (engines use one per run) so ``//`` and ``%`` are shifts for powers of two.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def paged_offsets(BT, table_base, kpos, ok, d, PERM, stride_block, stride_token, stride_dim, DIM,
                  BLOCK_SIZE: tl.constexpr, HAS_PERM: tl.constexpr):
    """int64 element offsets ``[N, BLOCK_D]`` (from the head's base) of the keys at ``kpos`` ``[N]``.

    ``table_base``: offset of the request's block-table row in ``BT`` (a scalar, or ``[N]`` when the
    rows belong to different requests); ``ok`` masks positions that must not be looked up.
    """
    block = tl.load(BT + table_base + kpos // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
    token = kpos % BLOCK_SIZE
    if HAS_PERM:
        inner = tl.load(PERM + token[:, None] * DIM + d[None, :], mask=ok[:, None] & (d[None, :] < DIM),
                        other=0).to(tl.int64)
    else:
        inner = token[:, None].to(tl.int64) * stride_token + d[None, :].to(tl.int64) * stride_dim
    return block[:, None] * stride_block + inner


@triton.jit
def decode_request(SEQ_LEN, REQ_ROW, stride_bt, pid, H, G):
    """(request, query head, KV head, query position, block-table row offset) of decode program ``pid``
    (one per (request, query head)); a request with ``seq_len == 0`` gets position -1."""
    b = pid // H
    h = pid % H
    return b, h, h // G, tl.load(SEQ_LEN + b) - 1, tl.load(REQ_ROW + b).to(tl.int64) * stride_bt


def cache_args(kv, which: str) -> tuple:
    """(cache tensor, permutation table or a dummy, strides block/head/token/dim, has_perm) for one
    of ``"key"`` / ``"value"`` of a ``PagedKV``."""
    cache = kv.key_cache if which == "key" else kv.value_cache
    layout = kv.inner_layout(which)
    if layout.perm is None:
        perm = torch.zeros(1, dtype=torch.int32, device=cache.device)
        return cache, perm, cache.stride(0), cache.stride(1), layout.stride_token, layout.stride_dim, False
    return cache, layout.perm, cache.stride(0), cache.stride(1), 0, 0, True
