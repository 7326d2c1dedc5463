"""Softmax partials: (log-sum-exp, normalised output) of each query over one set of keys.

An empty set has lse = -inf and output 0; ``merge`` combines the partials of a query's window and
spans.  The window (``window_partials``, ``window_decode``) and the spans of a decode query
(``span_partials_decode``) gather their keys and run ``key_partials``; the spans of a prefill chunk
(``span_partials``) are pairs (query, span) tiled by key-block footprint (``tiling``) so QK^T and PV
are real matrix products (PyTorch's fused CPU flash-attention kernel with a band mask).
"""

from __future__ import annotations

import torch

from ..tiling import build_span_tiles
from . import native_spans
from .workspace import (
    BLOCK_K,
    NEG_INF,
    SELECT_ELEMENTS,
    TEMP_ELEMENTS,
    TILE_PAIRS,
    KeyRow,
    Workspace,
    chunks,
    mask_at,
    offset_positions,
    row_keys,
)


def softmax_partials(logits: torch.Tensor, values: torch.Tensor):
    """Partials of a masked (-inf) logit matrix ``[..., n]`` against ``values`` ``[..., n, D]``."""
    m = logits.amax(dim=-1)
    m_safe = torch.where(m > NEG_INF, m, 0.0)
    p = torch.exp(logits - m_safe[..., None])
    l = p.sum(dim=-1)
    out = torch.matmul(p, values) / torch.where(l > 0, l, 1.0)[..., None]
    return m_safe + torch.log(l), out  # log(0) = -inf for an empty set


def _flash_cpu_available() -> bool:
    try:
        q = torch.zeros(1, 1, 1, 8)
        torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, q, q, 0.0, False, attn_mask=q[..., :1], scale=1.0)
        return True
    except Exception:  # pragma: no cover - depends on the torch build
        return False


_FLASH_CPU = None


def _masked_attention(q, keys, values, bias, scale):
    """Partials of ``q [n, T, D]`` over ``keys/values [n, F, D]`` with additive mask ``bias [n, T, F]``
    (0 or -inf; every row has at least one 0 except rows whose result is discarded).

    On CPU, PyTorch's fused flash-attention kernel (blocked, returns the log-sum-exp) is about twice
    as fast as separate matmul / mask / exp passes.
    """
    global _FLASH_CPU
    if q.device.type == "cpu" and q.dtype == torch.float32:
        if _FLASH_CPU is None:
            _FLASH_CPU = _flash_cpu_available()
        if _FLASH_CPU:
            out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
                q[:, None], keys[:, None], values[:, None], 0.0, False, attn_mask=bias[:, None], scale=scale)
            return lse[:, 0], out[:, 0]
    logits = torch.baddbmm(bias, q, keys.transpose(-1, -2), alpha=scale)
    return softmax_partials(logits, values)


def key_partials(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, scale: float):
    """Partials of queries ``q`` ``[..., M, D]`` over gathered ``keys``/``values`` ``[..., N, D]``
    (batch dims broadcast); ``valid`` (broadcasting against ``[..., M, N]``) marks real keys."""
    logits = torch.matmul(q, keys.transpose(-1, -2)).mul_(scale)
    logits.masked_fill_(~valid, NEG_INF)
    return softmax_partials(logits, values)


def window_partials(q2_rows, keys: KeyRow, positions, window: int, scale: float):
    """Partials of each query of a prefill chunk over its window ``[q - W + 1, q]``: lse
    ``[H_KV, G, C]``, out (+ ``D``).

    Without a window (W = 0) the output is None (lse -inf): nothing to merge.
    """
    kv_heads, group, count, dim = q2_rows.shape
    device = q2_rows.device
    lse = torch.full((kv_heads, group, count), NEG_INF, device=device)
    if window == 0 or count == 0:
        return lse, None
    out = torch.zeros((kv_heads, group, count, dim), device=device)
    offsets = torch.arange(1 - window, 1, device=device)
    head_offset = (torch.arange(kv_heads, device=device) * keys.key_len)[:, None, None]
    step = max(1, TEMP_ELEMENTS // max(1, kv_heads * window * dim))
    for lo, hi in chunks(count, step):
        idx, valid = offset_positions(positions[lo:hi], offsets, keys.mask)  # [c, W]
        rows = (head_offset + idx).reshape(-1)
        k_w = keys.k_flat.index_select(0, rows).view(kv_heads, hi - lo, window, dim)
        v_w = keys.v_flat.index_select(0, rows).view(kv_heads, hi - lo, window, dim)
        q = q2_rows[:, :, lo:hi].transpose(1, 2)  # [H_KV, c, G, D]
        pl, po = key_partials(q, k_w, v_w, valid[None, :, None, :], scale)  # [H_KV, c, G] (+ D)
        lse[:, :, lo:hi], out[:, :, lo:hi] = pl.transpose(1, 2), po.transpose(1, 2)
    return lse, out


def window_decode(q2: torch.Tensor, k, v, pos: torch.Tensor, key_mask, window: int, scale: float):
    """Partials of one query per batch row (q2 ``[B, H_KV, G, D]`` at ``pos`` ``[B]``) over its window:
    lse ``[B, H_KV, G]``, out (+ ``D``); lse -inf and out 0 without a window."""
    batch, kv_heads, group, dim = q2.shape
    if window == 0:
        return (torch.full((batch, kv_heads, group), NEG_INF, device=q2.device),
                torch.zeros((batch, kv_heads, group, dim), device=q2.device))
    idx, valid = offset_positions(pos, torch.arange(1 - window, 1, device=q2.device), key_mask)  # [B, W]
    return key_partials(q2, row_keys(k, idx[:, None, :]), row_keys(v, idx[:, None, :]),
                        valid[:, None, None, :], scale)


def span_partials_decode(q2: torch.Tensor, k, v, span_lo: torch.Tensor, span_hi: torch.Tensor, key_mask,
                         scale: float):
    """Partials of one query per batch row over each of its spans (keys gathered per span, padded to
    the longest span of the batch): q2 ``[B, H_KV, G, D]``, span_lo/hi ``[B, H_KV, G, k]``; lse
    ``[B, H_KV, G, k]``, out (+ ``D``)."""
    batch, kv_heads, group, dim = q2.shape
    longest = int((span_hi - span_lo + 1).clamp(min=0).max())
    if longest == 0:
        return (torch.full(span_lo.shape, NEG_INF, device=q2.device),
                torch.zeros(*span_lo.shape, dim, device=q2.device))
    idx = span_lo[..., None] + torch.arange(longest, device=q2.device)  # [B, H_KV, G, k, n]
    valid = idx <= span_hi[..., None]
    idx = idx.clamp(0, k.shape[2] - 1)
    if key_mask is not None:
        valid &= mask_at(key_mask, idx)
    flat = idx.view(batch, kv_heads, -1)
    keys = row_keys(k, flat).view(*idx.shape, dim)
    vals = row_keys(v, flat).view(*idx.shape, dim)
    lse, out = key_partials(q2[:, :, :, None, None, :], keys, vals, valid[..., None, :], scale)
    return lse.squeeze(-1), out.squeeze(-2)


def _band_rows(width: int) -> torch.Tensor:
    """``[rows, width]`` view whose row ``length * 2 * width + width - offset`` is the additive
    mask of the band ``[offset, offset + length)``: 0 inside, -inf outside.  Picking one row per
    (query, span) pair builds a tile's mask with one contiguous copy per row."""
    table = torch.full((width + 1, 2 * width), NEG_INF)
    for length in range(width + 1):
        table[length, width: width + length] = 0.0
    flat = table.reshape(-1)
    return flat.as_strided((flat.numel() - width + 1, width), (1, 1))


_BAND_CACHE: dict[int, torch.Tensor] = {}


def band_rows(width: int) -> torch.Tensor:
    rows = _BAND_CACHE.get(width)
    if rows is None:
        if len(_BAND_CACHE) > 32:
            _BAND_CACHE.clear()
        rows = _BAND_CACHE[width] = _band_rows(width)
    return rows


def span_partials(q2_rows, keys: KeyRow, span_lo, span_hi, scale: float, ws: Workspace,
                  block_k: int = BLOCK_K, tile_pairs: int = TILE_PAIRS):
    """Partials of every (query, span) pair over its span alone, computed by footprint tiles.

    q2_rows ``[H_KV, G, C, D]``; span_lo/hi ``[H_KV, G, C, k]``.  Returns lse ``[H_KV, G, C, k]``
    and out ``[H_KV, G, C, k, D]``.  Tiles are batched by width (key blocks read); everything a
    batch needs is indexed up front, so the loop body is a few large gathers and one attention call.
    """
    if native_spans.usable(q2_rows):  # the compiled kernel: each pair over its own span, rows in place
        if keys.native_layout is None:  # once per batch row, not per chunk (~0.1 s of copies at 32K)
            keys.native_layout = native_spans.key_layout(keys.k_flat, keys.v_flat, keys.key_len)
        return native_spans.span_partials_native(q2_rows, keys.k_flat, keys.v_flat, keys.key_len, keys.mask,
                                                 span_lo, span_hi, scale, keys.native_layout)
    kv_heads, group, count, dim = q2_rows.shape
    topk = span_lo.shape[-1]
    device = q2_rows.device
    pairs = kv_heads * group * count * topk
    lo_flat, hi_flat = span_lo.reshape(-1), span_hi.reshape(-1)
    lse = torch.full((pairs + 1,), NEG_INF, device=device)  # row `pairs` absorbs empty tile slots
    out = ws.get("pair_out", (pairs + 1, dim))
    out.index_fill_(0, torch.nonzero(hi_flat < lo_flat).squeeze(1), 0.0)  # pairs without a span
    pair_group = torch.arange(kv_heads, device=device).repeat_interleave(group * count * topk)
    tiles = build_span_tiles(lo_flat, hi_flat, pair_group, kv_heads, keys.key_len, block_k, tile_pairs)

    # Non-empty tiles sorted by width; per slot: query row, band-mask offset and length, pair id.
    order = torch.argsort(tiles.num_blocks, stable=True)
    order = order[tiles.num_blocks[order] > 0]
    widths = tiles.num_blocks[order]
    ids = tiles.pair_ids[order]  # [n_tiles, T]
    ids_ext = torch.where(ids >= 0, ids, pairs)
    q_rows = ids_ext.clamp(max=pairs - 1) // topk
    lo_ext = torch.cat([lo_flat, lo_flat.new_zeros(1)])  # empty slots: band [0, 1) of the tile
    hi_ext = torch.cat([hi_flat, hi_flat.new_zeros(1)])
    first_key = tiles.first_block[order] * block_k
    offset = lo_ext[ids_ext] - first_key[:, None]
    length = hi_ext[ids_ext] - lo_ext[ids_ext] + 1
    first_block = tiles.group[order] * keys.blocks + tiles.first_block[order]  # in the all-heads array
    q_flat = q2_rows.reshape(-1, dim)

    group_widths, group_sizes = torch.unique_consecutive(widths, return_counts=True)
    start = 0
    for width, size in zip(group_widths.tolist(), group_sizes.tolist()):
        span_keys = width * block_k
        bands = band_rows(span_keys)
        band_index = length[start:start + size] * (2 * span_keys) + span_keys - offset[start:start + size]
        block_offsets = torch.arange(width, device=device)
        step = max(1, SELECT_ELEMENTS // (tile_pairs * span_keys))
        for a, b in chunks(size, step):
            n = b - a
            g0, g1 = start + a, start + b
            q = ws.get("tile_q", (n * tile_pairs, dim))
            torch.index_select(q_flat, 0, q_rows[g0:g1].reshape(-1), out=q)
            bias = ws.get("tile_bias", (n * tile_pairs, span_keys))
            torch.index_select(bands, 0, band_index[a:b].reshape(-1), out=bias)
            bias = bias.view(n, tile_pairs, span_keys)
            if keys.col_bias is not None:
                cols = first_key[g0:g1, None] + torch.arange(span_keys, device=device)
                bias.add_(keys.col_bias[cols][:, None, :])
            # A tile reads `width` whole key blocks starting at its first block.
            block_ids = (first_block[g0:g1, None] + block_offsets).reshape(-1)
            k_t = ws.get("tile_k", (n * width, block_k * dim))
            v_t = ws.get("tile_v", (n * width, block_k * dim))
            torch.index_select(keys.k_blocks, 0, block_ids, out=k_t)
            torch.index_select(keys.v_blocks, 0, block_ids, out=v_t)
            pl, po = _masked_attention(q.view(n, tile_pairs, dim), k_t.view(n, span_keys, dim),
                                       v_t.view(n, span_keys, dim), bias, scale)
            # index_copy_ (not out[slots] = ...): several times faster; only the discarded row
            # `pairs` receives duplicate writes.
            slots = ids_ext[g0:g1].reshape(-1)
            lse.index_copy_(0, slots, pl.reshape(-1))
            out.index_copy_(0, slots, po.reshape(-1, dim))
        start += size
    shape = (kv_heads, group, count, topk)
    return lse[:pairs].view(shape), out[:pairs].view(*shape, dim)
