"""Efficient PyTorch superlinear attention: gathers only the keys each query needs.

The CPU implementation and the fallback on any device.  Work per query is O(sqrt t) (stripes,
spans) plus the window; nothing of size L_Q x L_KV is ever built.  Prefill runs in query chunks:

1. search: gather the K rows on each query's stripes (once per KV head, shared by the query heads
   of its group), one batched mat-mul with Q1, exact top-k (``select_topk``);
2. spans: ``attention_spans.span_bounds`` (the shared integer tables);
3. span attention: pairs (query, span) are tiled by key-block footprint (``tiling``) so QK^T and
   PV are real matrix products (PyTorch's fused CPU flash-attention kernel with a band mask);
   each pair yields softmax partials (log-sum-exp, normalised output);
4. window: the W most recent keys of each query, gathered, partials as above;
5. merge: each span's partials are merged with the window's (log-sum-exp), and the k results
   are mixed by the softmax of the search scores.

All arithmetic is float32 whatever the input dtype.  The big temporaries live in a ``Workspace``
reused across chunks: a fresh multi-megabyte tensor per chunk costs as much in page faults (first
touch of new pages) as the gather that fills it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .attention_spans import (
    SpanGeometry,
    SuperlinearParams,
    check_positions,
    key_start,
    normalize_key_mask,
    normalize_positions,
    ordered_score_key,
    span_bounds,
    span_geometry,
)
from .tiling import build_span_tiles

# float32 elements allowed in one temporary (gathered search keys; search scores and tile masks):
# 16 MiB measured fastest on the 2-core box (4x larger ones fall out of cache and are ~25% slower;
# much smaller ones multiply the torch ops, each a synchronisation point of the intra-op pool).
_TEMP_ELEMENTS = 1 << 22
_SELECT_ELEMENTS = 1 << 22
BLOCK_K = 32
TILE_PAIRS = 192
QUERY_CHUNK = 8192

NEG_INF = float("-inf")


def _chunks(total: int, size: int):
    size = max(1, size)
    for lo in range(0, total, size):
        yield lo, min(total, lo + size)


class Workspace:
    """Named scratch buffers that grow as needed and are reused by later chunks."""

    def __init__(self, device: torch.device):
        self.device = device
        self.buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        numel = math.prod(shape)
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype:
            buf = self.buffers[name] = torch.empty(numel, dtype=dtype, device=self.device)
        return buf[:numel].view(shape)


@dataclass
class KeyRow:
    """The keys of one batch row, in the layouts the steps read."""

    k_flat: torch.Tensor  # [H_KV * L_KV, D] fp32 (search and window gathers)
    v_flat: torch.Tensor
    k_blocks: torch.Tensor  # [H_KV * blocks, BLOCK_K * D], zero-padded to whole blocks (span tiles)
    v_blocks: torch.Tensor
    mask: torch.Tensor | None  # [L_KV] bool
    col_bias: torch.Tensor | None  # [blocks * BLOCK_K] 0 / -inf
    kv_heads: int
    key_len: int
    blocks: int

    @classmethod
    def build(cls, k_row: torch.Tensor, v_row: torch.Tensor, mask: torch.Tensor | None,
              block_k: int = BLOCK_K) -> "KeyRow":
        kv_heads, key_len, dim = k_row.shape
        blocks = -(-key_len // block_k)
        pad = blocks * block_k - key_len
        k32 = k_row.float().contiguous()
        v32 = v_row.float().contiguous()
        if pad:
            k_pad = torch.nn.functional.pad(k32, (0, 0, 0, pad))
            v_pad = torch.nn.functional.pad(v32, (0, 0, 0, pad))
        else:
            k_pad, v_pad = k32, v32
        col_bias = None
        if mask is not None:
            col_bias = torch.where(torch.nn.functional.pad(mask, (0, pad), value=False), 0.0, NEG_INF)
        return cls(k32.view(-1, dim), v32.view(-1, dim), k_pad.view(kv_heads * blocks, block_k * dim),
                   v_pad.view(kv_heads * blocks, block_k * dim), mask, col_bias, kv_heads, key_len, blocks)


# --------------------------------------------------------------------------------------------------
# Search


def _top_values(x: torch.Tensor, count: int, last_value_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Largest ``count`` values of the last axis, best first (any order among equal values), and
    their indices (``count - 1`` of them with ``last_value_only``: the last value is only compared).

    For a handful of values, rounds of max-and-remove beat ``torch.topk`` on CPU by about a third;
    ``x`` is restored afterwards.
    """
    if count > 8:
        values, indices = x.topk(count, dim=-1)
        return values, indices[..., : count - 1] if last_value_only else indices
    values, indices = [], []
    for r in range(count):
        if last_value_only and r + 1 == count:
            values.append(x.amax(dim=-1, keepdim=True))  # no index needed: a quarter of the cost
            break
        v, i = x.max(dim=-1, keepdim=True)
        values.append(v)
        indices.append(i)
        if r + 1 < count:
            x.scatter_(-1, i, NEG_INF)
    # Restore in reverse: once a row runs out of finite values, max may return an index already
    # taken; the earliest (real) value must be written last.
    for v, i in zip(reversed(values[: len(indices)]), reversed(indices)):
        x.scatter_(-1, i, v)
    return torch.cat(values, -1), torch.cat(indices, -1)


def select_topk(scores: torch.Tensor, valid: torch.Tensor | None, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k over the last axis of ``scores`` (candidates in stripe order, nearest first).

    ``valid`` (broadcasting against ``scores``, None = all) marks real candidates; ``scores`` is
    masked in place.  Returns indices ``[..., k]`` best first and whether each is a real candidate.
    Ties are broken as ``attention_spans.ordered_score_key`` says (the farther stripe wins).  A float top-k
    of k + 1 finds the winners; only rows whose k-th and (k+1)-th scores are equal (a tie at the
    boundary: exactly equal dot products) are redone with the exact integer key.
    """
    n = scores.shape[-1]
    kk = min(topk, n)
    masked = scores if valid is None else scores.masked_fill_(~valid, NEG_INF)
    top, idx = _top_values(masked, min(kk + 1, n), last_value_only=n > kk)
    if n > kk:
        tie = (top[..., kk - 1] == top[..., kk]) & (top[..., kk - 1] > NEG_INF)  # -0.0 == +0.0 too
        top = top[..., :kk]
        if bool(tie.any()):
            rows = tie.nonzero(as_tuple=True)
            tied = masked[rows]
            exact = ordered_score_key(tied, torch.arange(n, device=scores.device), tied > NEG_INF)
            idx, top = idx.clone(), top.clone()
            idx[rows] = exact.topk(kk, dim=-1).indices
            top[rows] = torch.gather(tied, -1, idx[rows])
    # Rows with fewer than k candidates end in -inf entries (whose indices may repeat): not found.
    found = top > NEG_INF
    # Canonical order inside the k (score, then farther stripe), on k values only.
    order = ordered_score_key(top, idx, found).argsort(dim=-1, descending=True)
    return torch.gather(idx, -1, order), torch.gather(found, -1, order)


def search_rows(q1_rows: torch.Tensor, keys: KeyRow, positions: torch.Tensor, geometry: SpanGeometry,
                topk: int, ws: Workspace):
    """Top-k anchors for the queries of one batch row.

    q1_rows: ``[H_KV, G, C, D]`` fp32; positions ``[C]``.  Returns anchors ``[H_KV, G, C, k]``
    int64 (-1 = none) and scores fp32 (-inf = none), best first.

    Scores are computed in small blocks (the gathered keys stay in cache) into one larger buffer,
    and the top-k runs once per large block: every torch op is a synchronisation point of the
    intra-op thread pool, and on a busy machine each costs up to a scheduler time slice.
    """
    kv_heads, group, count, dim = q1_rows.shape
    device = q1_rows.device
    anchors = torch.full((count, kv_heads, group, topk), -1, dtype=torch.int64, device=device)
    scores = torch.full((count, kv_heads, group, topk), NEG_INF, device=device)
    stripes = int(geometry.stripe_count[int(positions.max())]) if count else 0
    if stripes > 0:
        distance = geometry.stripe_distance[:stripes].to(device)
        # Query-major layouts: every block of queries is one contiguous slice of each buffer.
        q_by_query = ws.get("search_q", (count, kv_heads, group, dim))
        q_by_query.copy_(q1_rows.permute(2, 0, 1, 3))
        head_offset = (torch.arange(kv_heads, device=device) * keys.key_len)[None, :, None]
        gather_step = max(1, _TEMP_ELEMENTS // max(1, kv_heads * stripes * dim))
        select_step = max(gather_step, _SELECT_ELEMENTS // max(1, kv_heads * group * stripes))
        for lo, hi in _chunks(count, select_step):
            cand = positions[lo:hi, None] + 1 - distance  # [c, n] anchor positions
            valid = cand >= 0
            all_valid = bool(valid.all()) and keys.mask is None
            cand = cand.clamp(min=0)
            if keys.mask is not None:
                valid &= keys.mask[cand]
            rows = cand[:, None, :] + head_offset  # [c, H_KV, n]
            s_t = ws.get("search_scores_t", (hi - lo, kv_heads, stripes, group))
            for a, b in _chunks(hi - lo, gather_step):
                # One gather of the stripe keys serves the G query heads of each KV head; keys x
                # queries ([n, D] x [D, G] per query) runs about twice as fast as queries x keys.
                k_st = ws.get("search_keys", ((b - a) * kv_heads * stripes, dim))
                torch.index_select(keys.k_flat, 0, rows[a:b].reshape(-1), out=k_st)
                torch.matmul(k_st.view(b - a, kv_heads, stripes, dim), q_by_query[lo + a:lo + b].transpose(-1, -2),
                             out=s_t[a:b])
            s = ws.get("search_scores", (hi - lo, kv_heads, group, stripes))
            s.copy_(s_t.transpose(-1, -2))
            best, found = select_topk(s, None if all_valid else valid[:, None, None, :], topk)
            kk = best.shape[-1]
            picked = torch.gather(cand[:, None, None, :].expand(-1, kv_heads, group, -1), -1, best)
            anchors[lo:hi, :, :, :kk] = torch.where(found, picked, -1)
            scores[lo:hi, :, :, :kk] = torch.where(found, torch.gather(s, -1, best), NEG_INF)
    return anchors.permute(1, 2, 0, 3).contiguous(), scores.permute(1, 2, 0, 3).contiguous()


# --------------------------------------------------------------------------------------------------
# Softmax partials: (log-sum-exp, normalised output) of one query over one set of keys.
# An empty set has lse = -inf and output 0.


def _partials(logits: torch.Tensor, values: torch.Tensor):
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
    return _partials(logits, values)


def window_partials(q2_rows, keys: KeyRow, positions, window: int, scale: float):
    """Partials of each query over its window ``[q - W + 1, q]``: lse ``[H_KV, G, C]``, out (+ ``D``).

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
    step = max(1, _TEMP_ELEMENTS // max(1, kv_heads * window * dim))
    for lo, hi in _chunks(count, step):
        idx = positions[lo:hi, None] + offsets  # [c, W]
        valid = idx >= 0
        idx = idx.clamp(min=0)
        if keys.mask is not None:
            valid &= keys.mask[idx]
        rows = (head_offset + idx).reshape(-1)
        k_w = keys.k_flat.index_select(0, rows).view(kv_heads, hi - lo, window, dim)
        v_w = keys.v_flat.index_select(0, rows).view(kv_heads, hi - lo, window, dim)
        q = q2_rows[:, :, lo:hi].transpose(1, 2)  # [H_KV, c, G, D]
        logits = torch.matmul(q, k_w.transpose(-1, -2)).mul_(scale)  # [H_KV, c, G, W]
        logits.masked_fill_(~valid[None, :, None, :], NEG_INF)
        pl, po = _partials(logits, v_w)
        lse[:, :, lo:hi], out[:, :, lo:hi] = pl.transpose(1, 2), po.transpose(1, 2)
    return lse, out


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
        step = max(1, _SELECT_ELEMENTS // (tile_pairs * span_keys))
        for a, b in _chunks(size, step):
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


def merge_and_gate(span_lse, span_out, win_lse, win_out, anchors, scores):
    """Mix the k span outputs (each merged with the window) by the softmax of the search scores.

    span_*: ``[..., k]`` (+ ``D``); win_*: ``[...]`` (+ ``D``; None when there is no window).
    Returns ``[..., D]`` fp32.

    O_j = (e^lse_j o_j + e^lse_w o_w) / (e^lse_j + e^lse_w) and out = sum_j g_j O_j, rearranged
    so that only per-(query, span) scalars are computed before one weighted sum of D-vectors.
    """
    wl = win_lse[..., None]
    top = torch.maximum(span_lse, wl)
    top = torch.where(top > NEG_INF, top, 0.0)
    a_span = torch.exp(span_lse - top)  # exp(-inf) = 0 for an empty part
    a_win = torch.exp(wl - top)
    den = a_span + a_win
    found = anchors >= 0
    gate = torch.softmax(scores.masked_fill(~found, NEG_INF), dim=-1)
    # No valid span: every O_j is the window alone and the gate is uniform.
    gate = torch.where(found.any(-1, keepdim=True), gate, 1.0 / gate.shape[-1])
    g = gate / torch.where(den > 0, den, 1.0)  # a query with no key at all outputs 0
    coef_span = g * a_span
    coef_win = (g * a_win).sum(-1)
    if win_out is None:
        out = torch.zeros(span_out.shape[:-2] + span_out.shape[-1:], device=span_out.device)
    else:
        out = coef_win[..., None] * win_out
    for j in range(span_out.shape[-2]):  # k is small: k fused multiply-adds beat a batched matmul
        out.addcmul_(coef_span[..., j, None], span_out[..., j, :])
    return out


# --------------------------------------------------------------------------------------------------
# Entry points


def _prepare(q1, q2, k, v, cache_position, attention_mask, params, scale):
    params = params or SuperlinearParams()
    batch, heads, query_len, dim = q2.shape
    kv_heads, key_len = k.shape[1], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"H_Q={heads} is not a multiple of H_KV={kv_heads}")
    device = q2.device
    positions = normalize_positions(cache_position, batch, query_len, key_len, device)
    check_positions(positions, key_len)
    key_mask = normalize_key_mask(attention_mask, batch, key_len, device)
    start = key_start(key_mask, batch, key_len, device)
    geometry = span_geometry(params, key_len, device)
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    return params, positions, key_mask, start, geometry, scale


def gather_superlinear_attention(q1, q2, k, v, cache_position=None, attention_mask=None,
                                 params: SuperlinearParams | None = None, scale: float | None = None,
                                 query_chunk: int = QUERY_CHUNK, return_search: bool = False):
    """Superlinear attention (prefill or a chunk of it) in O(L_Q * sqrt(L_KV)) time and memory.

    q1, q2 ``[B, H_Q, L_Q, D]``; k, v ``[B, H_KV, L_KV, D]``.  Returns ``[B, H_Q, L_Q, D]`` in
    ``q2``'s dtype (and, with ``return_search``, anchors, scores and span bounds).
    """
    params, positions, key_mask, start, geometry, scale = _prepare(
        q1, q2, k, v, cache_position, attention_mask, params, scale)
    batch, heads, query_len, dim = q2.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    topk = params.topk
    out = torch.empty(q2.shape, dtype=q2.dtype, device=q2.device)
    ws = Workspace(q2.device)
    search = None
    if return_search:
        shape = (batch, heads, query_len, topk)
        search = [torch.empty(shape, dtype=torch.int64, device=q2.device),
                  torch.empty(shape, dtype=torch.float32, device=q2.device),
                  torch.empty(shape, dtype=torch.int64, device=q2.device),
                  torch.empty(shape, dtype=torch.int64, device=q2.device)]
    for b in range(batch):
        keys = KeyRow.build(k[b], v[b], None if key_mask is None else key_mask[b])
        for lo, hi in _chunks(query_len, query_chunk):
            count = hi - lo
            pos = positions[b, lo:hi]
            q1_rows = q1[b, :, lo:hi].float().view(kv_heads, group, count, dim)
            q2_rows = q2[b, :, lo:hi].float().view(kv_heads, group, count, dim)
            anchors, scores = search_rows(q1_rows, keys, pos, geometry, topk, ws)
            span_lo, span_hi = span_bounds(anchors.view(1, heads, count, topk), pos[None], start[b:b + 1], geometry)
            span_lo = span_lo.view(kv_heads, group, count, topk)
            span_hi = span_hi.view(kv_heads, group, count, topk)
            win = window_partials(q2_rows, keys, pos, geometry.window, scale)
            spans = span_partials(q2_rows, keys, span_lo, span_hi, scale, ws)
            res = merge_and_gate(*spans, *win, anchors, scores)
            out[b, :, lo:hi] = res.view(heads, count, dim).to(out.dtype)
            if search is not None:
                for dst, src in zip(search, (anchors, scores, span_lo, span_hi)):
                    dst[b, :, lo:hi] = src.reshape(heads, count, topk)
    if return_search:
        return out, tuple(search)
    return out


def gather_superlinear_search(q1, k, cache_position=None, attention_mask=None,
                              params: SuperlinearParams | None = None, query_chunk: int = QUERY_CHUNK):
    """Anchors, scores and span bounds ``[B, H_Q, L_Q, k]`` (the search step alone)."""
    params, positions, key_mask, start, geometry, _ = _prepare(
        q1, q1, k, k, cache_position, attention_mask, params, 1.0)
    batch, heads, query_len, dim = q1.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    topk = params.topk
    ws = Workspace(q1.device)
    anchors = torch.empty((batch, heads, query_len, topk), dtype=torch.int64, device=q1.device)
    scores = torch.empty((batch, heads, query_len, topk), dtype=torch.float32, device=q1.device)
    for b in range(batch):
        keys = KeyRow.build(k[b], k[b], None if key_mask is None else key_mask[b])
        for lo, hi in _chunks(query_len, query_chunk):
            q1_rows = q1[b, :, lo:hi].float().view(kv_heads, group, hi - lo, dim)
            a, sc = search_rows(q1_rows, keys, positions[b, lo:hi], geometry, topk, ws)
            anchors[b, :, lo:hi] = a.reshape(heads, hi - lo, topk)
            scores[b, :, lo:hi] = sc.reshape(heads, hi - lo, topk)
    span_lo, span_hi = span_bounds(anchors, positions, start, geometry)
    return anchors, scores, span_lo, span_hi


def gather_superlinear_decode(q1, q2, k, v, cache_position, attention_mask=None,
                              params: SuperlinearParams | None = None, scale: float | None = None):
    """One decode step per batch row: q ``[B, H_Q, 1, D]``, each row at its own position.

    ``cache_position``: ``[B]`` (or ``[1]``/int shared).  K/V may be a longer static cache: keys
    after a row's position are never read.
    """
    params, positions, key_mask, start, geometry, scale = _prepare(
        q1, q2, k, v, cache_position, attention_mask, params, scale)
    batch, heads, query_len, dim = q2.shape
    if query_len != 1:
        raise ValueError(f"decode takes one query per row, got L_Q={query_len}")
    kv_heads, key_len = k.shape[1], k.shape[2]
    group = heads // kv_heads
    topk = params.topk
    device = q2.device
    pos = positions[:, 0]  # [B]
    q1f = q1.float().view(batch, kv_heads, group, dim)
    q2f = q2.float().view(batch, kv_heads, group, dim)
    bidx = torch.arange(batch, device=device)[:, None, None]
    hidx = torch.arange(kv_heads, device=device)[None, :, None]

    # Search: gather the stripe keys once per KV head, score them with every query head of the group.
    stripes = int(geometry.stripe_count[int(pos.max())])
    anchors = torch.full((batch, kv_heads, group, topk), -1, dtype=torch.int64, device=device)
    scores = torch.full((batch, kv_heads, group, topk), NEG_INF, device=device)
    if stripes > 0:
        cand = pos[:, None] + 1 - geometry.stripe_distance[:stripes].to(device)  # [B, n]
        valid = cand >= 0
        cand = cand.clamp(min=0)
        if key_mask is not None:
            valid &= torch.gather(key_mask, 1, cand)
        keys = k[bidx, hidx, cand[:, None, :]].float()  # [B, H_KV, n, D]
        s = torch.matmul(q1f, keys.transpose(-1, -2))  # [B, H_KV, G, n]
        best, found = select_topk(s, valid[:, None, None, :], topk)
        kk = best.shape[-1]
        a = torch.gather(cand[:, None, None, :].expand(-1, kv_heads, group, -1), -1, best)
        anchors[..., :kk] = torch.where(found, a, -1)
        scores[..., :kk] = torch.where(found, torch.gather(s, -1, best), NEG_INF)
    span_lo, span_hi = span_bounds(anchors.view(batch, heads, 1, topk), positions, start, geometry)
    span_lo = span_lo.view(batch, kv_heads, group, topk)
    span_hi = span_hi.view(batch, kv_heads, group, topk)

    # Spans: gather each span's keys (padded to the longest span in the batch).
    longest = int((span_hi - span_lo + 1).clamp(min=0).max())
    if longest > 0:
        idx = span_lo[..., None] + torch.arange(longest, device=device)  # [B, H_KV, G, k, n]
        ok = idx <= span_hi[..., None]
        idx = idx.clamp(0, key_len - 1)
        if key_mask is not None:
            ok &= torch.gather(key_mask, 1, idx.view(batch, -1)).view(idx.shape)
        flat = idx.view(batch, kv_heads, -1)
        keys = k[bidx, hidx, flat].float().view(*idx.shape, dim)
        vals = v[bidx, hidx, flat].float().view(*idx.shape, dim)
        logits = (keys @ q2f[:, :, :, None, :, None]).squeeze(-1) * scale  # [B, H_KV, G, k, n]
        logits.masked_fill_(~ok, NEG_INF)
        span_lse, span_out = _partials(logits[..., None, :], vals)
        span_lse, span_out = span_lse.squeeze(-1), span_out.squeeze(-2)
    else:
        span_lse = torch.full(span_lo.shape, NEG_INF, device=device)
        span_out = torch.zeros(*span_lo.shape, dim, device=device)

    # Window.
    window = geometry.window
    if window > 0:
        idx = pos[:, None] + torch.arange(1 - window, 1, device=device)  # [B, W]
        ok = idx >= 0
        idx = idx.clamp(min=0)
        if key_mask is not None:
            ok &= torch.gather(key_mask, 1, idx)
        keys = k[bidx, hidx, idx[:, None, :]].float()  # [B, H_KV, W, D]
        vals = v[bidx, hidx, idx[:, None, :]].float()
        logits = torch.matmul(q2f, keys.transpose(-1, -2)) * scale  # [B, H_KV, G, W]
        logits.masked_fill_(~ok[:, None, None, :], NEG_INF)
        win_lse, win_out = _partials(logits, vals)
    else:
        win_lse = torch.full((batch, kv_heads, group), NEG_INF, device=device)
        win_out = torch.zeros((batch, kv_heads, group, dim), device=device)
    out = merge_and_gate(span_lse, span_out, win_lse, win_out, anchors, scores)
    return out.reshape(batch, heads, 1, dim).to(q2.dtype)
