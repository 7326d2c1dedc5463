"""The ``gather`` / ``naive`` path over a paged cache (CPU, and any device without Triton).

What the engines' backends did through ``fetch_kv``/``read_kv``: a prompt or chunk reads its
request's prefix into a contiguous copy (:meth:`PagedKV.read_prefix`) and runs
``superlinear_attention``; single-token rows read only their stripes and window, then the spans the
search picks (O(sqrt t) keys, :meth:`PagedKV.read_positions`), into zero-filled buffers, and run one
``superlinear_decode`` for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .dispatch import superlinear_attention, superlinear_decode, superlinear_search
from .attention_spans import SpanGeometry, span_geometry
from .paged_kv import PagedKV

# The CPU decode buffers are rounded up to this many keys (the gather path's per-row key layout is
# then a view of the buffer, not a padded copy).
KEY_ALIGN = 256


def decode_positions(position: int, geometry: SpanGeometry) -> torch.Tensor:
    """Keys a decode query at ``position`` reads before its spans are known: its stripes (the search
    candidates) and its window, ascending."""
    stripes = int(geometry.stripe_count[position])
    cand = position + 1 - geometry.stripe_distance[:stripes]
    window = torch.arange(max(0, position - geometry.window + 1), position + 1)
    return torch.cat([cand.flip(0), window])


def span_positions(span_start: torch.Tensor, span_end: torch.Tensor) -> torch.Tensor:
    """Every key inside the selected spans ``[start, end]`` (inclusive; empty when end < start)."""
    lo, hi = span_start.reshape(-1), span_end.reshape(-1)
    keep = hi >= lo
    parts = [torch.arange(a, b + 1) for a, b in zip(lo[keep].tolist(), hi[keep].tolist())]
    return torch.unique(torch.cat(parts)) if parts else torch.zeros(0, dtype=torch.int64)


def _host_ints(x: torch.Tensor | Sequence[int]) -> list[int]:
    return [int(n) for n in (x.tolist() if isinstance(x, torch.Tensor) else x)]


def _param_kwargs(params) -> dict:
    return dict(sw_index=params.sw_index, topk=params.topk, backward_factor=params.backward_factor,
                forward_factor=params.forward_factor, span_power=params.span_power,
                search_power=params.search_power, inv_search_power_int=params.inv_search_power_int)


def _decode_rows(q1: torch.Tensor, q2: torch.Tensor, kv: PagedKV, requests: list[int], seq_lens: list[int],
                 params, scale, impl: str) -> torch.Tensor:
    """Decode queries ``[n, H_Q, D]`` of ``requests`` in one ``superlinear_decode`` call, reading only
    the keys it uses: ``[n, H_Q, D]`` fp32.

    K/V are zero-filled ``[n, H_KV, longest, D]`` buffers into which only the stripes and the window,
    then the spans the search picks, are read from the cache: O(sqrt t) reads per row instead of the
    whole sequence (the zero fill is a memset whose untouched pages are never faulted in).  The
    kernels read no other key, so the result is the same as over the full cache.
    """
    kwargs = _param_kwargs(params)
    longest = -(-max(seq_lens[r] for r in requests) // KEY_ALIGN) * KEY_ALIGN
    geometry = span_geometry(params, longest)
    positions = [seq_lens[r] - 1 for r in requests]
    first = [decode_positions(p, geometry) for p in positions]
    rows = len(requests)
    shape = (rows, kv.kv_heads, longest, kv.head_dim)
    k = kv.key_cache.new_zeros(shape)
    v = kv.value_cache.new_zeros(shape)
    for i, r in enumerate(requests):
        kr, vr = kv.read_positions(r, first[i])
        k[i, :, first[i].to(k.device)] = kr
        v[i, :, first[i].to(k.device)] = vr
    qs1, qs2 = q1[:, :, None, :], q2[:, :, None, :]  # [n, H_Q, 1, D]
    pos = torch.tensor(positions, device=q2.device)
    found = superlinear_search(qs1, k, pos[:, None], impl=impl, **kwargs)
    for i, r in enumerate(requests):
        spans = span_positions(found.span_start[i].cpu(), found.span_end[i].cpu())
        if spans.numel():
            dst = spans.to(k.device)
            k[i, :, dst], v[i, :, dst] = kv.read_positions(r, spans)
    res = superlinear_decode(qs1, qs2, k, v, pos, scale=scale, impl=impl, **kwargs)
    return res[:, :, 0, :]


def cpu_attention_paged(q1, q2, kv: PagedKV, query_start, params, scale, impl, out):
    """``superlinear_attention_paged`` with ``impl`` ``"gather"`` / ``"naive"``: writes and returns ``out``."""
    starts = _host_ints(query_start)
    seq_lens = _host_ints(kv.seq_lens)
    if len(starts) != len(seq_lens) + 1:
        raise ValueError(f"query_start has {len(starts)} entries for {len(seq_lens)} requests (needs R + 1)")
    kwargs = _param_kwargs(params)
    decodes: list[int] = []
    for r, seq_len in enumerate(seq_lens):
        lo, hi = starts[r], starts[r + 1]
        count = hi - lo
        if count <= 0:
            continue
        if count > seq_len:
            raise ValueError(f"request {r}: {count} query tokens but only {seq_len} cached tokens")
        if count == 1:
            decodes.append(r)
            continue
        k, v = kv.read_prefix(r, seq_len)
        positions = torch.arange(seq_len - count, seq_len, device=q2.device)
        res = superlinear_attention(q1[lo:hi].transpose(0, 1)[None], q2[lo:hi].transpose(0, 1)[None],
                                    k[None], v[None], positions, scale=scale, impl=impl, **kwargs)
        out[lo:hi] = res[0].transpose(0, 1).to(out.dtype)
    if decodes:
        index = torch.tensor([starts[r] for r in decodes], device=q2.device)
        res = _decode_rows(q1.index_select(0, index), q2.index_select(0, index), kv, decodes, seq_lens,
                           params, scale, impl)
        out.index_copy_(0, index, res.to(out.dtype))
    return out


def cpu_decode_paged(q1, q2, kv: PagedKV, params, scale, impl, out):
    """``superlinear_decode_paged`` with ``impl`` ``"gather"`` / ``"naive"``: writes and returns ``out``
    (0 for a request with ``seq_len == 0``)."""
    seq_lens = _host_ints(kv.seq_lens)
    rows = [r for r, n in enumerate(seq_lens) if n > 0]
    empty = [r for r, n in enumerate(seq_lens) if n <= 0]
    if empty:
        out[empty] = 0
    if rows:
        index = torch.tensor(rows, device=q2.device)
        res = _decode_rows(q1.index_select(0, index), q2.index_select(0, index), kv, rows, seq_lens,
                           params, scale, impl)
        out.index_copy_(0, index, res.to(out.dtype))
    return out
