"""Addressing K/V inside a paged cache from Triton: logical key position -> element offset.

A key at logical position ``p`` of a request lives in block ``block_table[row, p // block_size]``
at token ``p % block_size``; inside the (block, head) its D elements sit at ``t * stride_token +
d * stride_dim`` (strided layouts: row-major, transposed) or at ``perm[t * D + d]`` (any other
permutation of the block, read from a small table that stays in cache).  ``block_size`` is a
``constexpr`` (engines use one per run) so ``//`` and ``%`` are shifts for powers of two.

The paged kernels take each of K and V as one argument, a :class:`PagedCache` (a named tuple:
Triton passes its fields as kernel parameters, specialised like any other), so what addresses a
(block, head) is declared once, here.  The block table is one argument beside them: K and V share
it, and one pointer lets the compiler load a key's block id once for both.

The two search kernels (decode, prefill) take what they share besides the cache the same way: one
:class:`StripeSearch` (the queries, the stripe tables, the top-k buffers and k), built by
:func:`stripe_search`.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl


class PagedCache(NamedTuple):
    """One of K / V of a ``PagedKV`` as a Triton kernel argument (its block table apart)."""

    data: torch.Tensor  # [num_blocks, H_KV, block_size, D], any strides
    perm: torch.Tensor  # int32 [block_size * D] layout table, or a 1-element dummy (strided layout)
    stride_block: int
    stride_head: int
    stride_token: int  # 0 with a layout table
    stride_dim: int  # 0 with a layout table
    block_size: tl.constexpr
    has_perm: tl.constexpr


def paged_cache(kv, which: str) -> PagedCache:
    """``"key"`` or ``"value"`` of a ``PagedKV`` as a kernel argument."""
    cache = kv.key_cache if which == "key" else kv.value_cache
    layout = kv.inner_layout(which)
    if layout.perm is None:
        perm = torch.zeros(1, dtype=torch.int32, device=cache.device)
        token, dim, has_perm = layout.stride_token, layout.stride_dim, False
    else:
        perm, token, dim, has_perm = layout.perm, 0, 0, True
    return PagedCache(cache, perm, cache.stride(0), cache.stride(1), token, dim, tl.constexpr(kv.block_size),
                      tl.constexpr(has_perm))


class StripeSearch(NamedTuple):
    """One stripe search as a Triton kernel argument: the query rows it scores, the stripe tables
    it walks and the top-k buffers it fills (rows: requests in decode, tokens in prefill)."""

    q: torch.Tensor  # [rows, H_Q, D], any strides
    stride_row: int
    stride_head: int
    stride_dim: int
    stripe_distance: torch.Tensor  # int32: stripe j's anchor is position + 1 - stripe_distance[j]
    stripe_count: torch.Tensor  # int32 [max_len]: the stripes with an anchor >= 0 at each position
    anchor: torch.Tensor  # int32 [..., topk], written
    score: torch.Tensor  # fp32 [..., topk], written
    topk: tl.constexpr
    topk_pad: tl.constexpr  # next power of two: the register width of a top-k set


def stripe_search(q: torch.Tensor, geo, lead: tuple[int, ...], topk: int) -> StripeSearch:
    """The search of ``q`` over ``geo``'s stripes (int32 tables) into fresh ``(*lead, topk)`` buffers;
    ``lead`` is the launcher's output layout, which its kernel indexes."""
    anchor = torch.empty((*lead, topk), dtype=torch.int32, device=q.device)
    score = torch.empty((*lead, topk), dtype=torch.float32, device=q.device)
    # mypy cannot count a starred tuple's items
    return StripeSearch(q, *q.stride(), geo.stripe_distance, geo.stripe_count, anchor, score,  # type: ignore[call-arg, arg-type]
                        tl.constexpr(topk), tl.constexpr(triton.next_power_of_2(topk)))


@triton.jit
def paged_offsets(C, BT, table_base, kpos, ok, d, DIM):
    """int64 element offsets ``[N, BLOCK_D]`` (from the head's base) of the keys at ``kpos`` ``[N]``
    in the paged cache ``C`` with block table ``BT``.

    ``table_base``: offset of the request's block-table row (a scalar, or ``[N]`` when the rows
    belong to different requests); ``ok`` masks positions that must not be looked up.
    """
    block = tl.load(BT + table_base + kpos // C.block_size, mask=ok, other=0).to(tl.int64)
    token = kpos % C.block_size
    if C.has_perm:
        inner = tl.load(C.perm + token[:, None] * DIM + d[None, :], mask=ok[:, None] & (d[None, :] < DIM),
                        other=0).to(tl.int64)
    else:
        inner = token[:, None].to(tl.int64) * C.stride_token + d[None, :].to(tl.int64) * C.stride_dim
    return block[:, None] * C.stride_block + inner


@triton.jit
def load_paged_rows(C, head, BT, table_base, kpos, ok, d, d_ok, DIM):
    """The rows ``[N, BLOCK_D]`` at ``kpos`` of the head of ``C`` that starts at ``head`` (0 where
    ``ok`` or ``d_ok`` is false), in the cache's dtype."""
    offs = paged_offsets(C, BT, table_base, kpos, ok, d, DIM)
    return tl.load(head + offs, mask=ok[:, None] & d_ok[None, :], other=0.0)


@triton.jit
def decode_request(SEQ_LEN, REQ_ROW, stride_bt, pid, H, G):
    """(request, query head, KV head, query position, block-table row offset) of decode program ``pid``
    (one per (request, query head)); a request with ``seq_len == 0`` gets position -1."""
    b = pid // H
    h = pid % H
    return b, h, h // G, tl.load(SEQ_LEN + b) - 1, tl.load(REQ_ROW + b).to(tl.int64) * stride_bt
