"""Superlinear attention over a serving batch: ragged requests whose K/V live in an engine's cache.

Engine-agnostic (vLLM's paged blocks and SGLang's token pool both come in through ``fetch_kv`` and
``read_kv``):
the batch is the flattened query tokens of several requests, request ``r`` owning rows
``query_start[r]:query_start[r+1]`` at the last positions of its ``seq_lens[r]`` tokens (the cache
already holds the K/V of those rows). Prefill rows (several per request: a prompt or a chunk of one)
go through ``superlinear_attention`` one request at a time; single-token rows (decode) of all
requests go through one ``superlinear_decode`` call that reads only the keys it needs (``_decode``). Search and attention use the same query (models
with one query projection).

Imports torch and the kernels only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from toolkit.kernels.superlinear.api import (
    superlinear_attention,
    superlinear_decode,
    superlinear_search,
)
from toolkit.kernels.superlinear.paged import decode_positions, span_positions
from toolkit.patches.common.superlinear.config import SuperlinearConfig

# fetch_kv(r, n) -> (k, v), each [H_KV, >= n, D]: the first n cached tokens of request r, in order.
FetchKV = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]
# read_kv(r, positions) -> (k, v), each [H_KV, len(positions), D]: request r's tokens at those positions.
ReadKV = Callable[[int, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]
KEY_ALIGN = 256


def superlinear_ragged(query: torch.Tensor, query_start: Sequence[int], seq_lens: Sequence[int],
                       fetch_kv: FetchKV, read_kv: ReadKV, config: SuperlinearConfig, scale: float,
                       out: torch.Tensor) -> torch.Tensor:
    """Write superlinear attention of ``query`` ``[T, H_Q, D]`` into ``out`` ``[T, H_Q, D]``."""
    kwargs = config.kernel_kwargs()
    decodes: list[int] = []
    for r, seq_len in enumerate(seq_lens):
        lo, hi = int(query_start[r]), int(query_start[r + 1])
        count = hi - lo
        if count <= 0:
            continue
        if count == 1:
            decodes.append(r)
            continue
        if count > seq_len:
            raise ValueError(f"request {r}: {count} query tokens but only {seq_len} cached tokens")
        k, v = fetch_kv(r, seq_len)
        q = query[lo:hi].transpose(0, 1)[None]  # [1, H_Q, L_Q, D]
        positions = torch.arange(seq_len - count, seq_len, device=query.device)
        res = superlinear_attention(q, q, k[None], v[None], positions, scale=scale, impl=config.impl, **kwargs)
        out[lo:hi] = res[0].transpose(0, 1).to(out.dtype)
    if decodes:
        _decode(query, query_start, seq_lens, decodes, read_kv, config, scale, out, kwargs)
    return out


def _decode(query, query_start, seq_lens, rows, read_kv, config, scale, out, kwargs) -> None:
    """All decode rows in one ``superlinear_decode`` call, reading only the keys it uses.

    K/V are zero-filled ``[B, H_KV, longest, D]`` buffers into which only the stripes and the window,
    then the spans the search picks, are read from the engine's cache: O(sqrt t) reads per row
    instead of the whole sequence (the zero fill is a memset). The kernel reads no other key, so the
    result is the same as over the full cache (tests/patches/vllm/superlinear/test_backend_logic.py).
    """
    from toolkit.kernels.superlinear.spans import span_geometry

    # Rounded up so the kernels' per-row key layout is a view of this buffer, not a padded copy.
    longest = -(-max(int(seq_lens[r]) for r in rows) // KEY_ALIGN) * KEY_ALIGN
    geometry = span_geometry(config.params(), longest)
    positions = [int(seq_lens[r]) - 1 for r in rows]
    first = [decode_positions(p, geometry).to(query.device) for p in positions]
    k0, v0 = read_kv(rows[0], first[0])
    kv_heads, dim = k0.shape[0], k0.shape[-1]
    k = k0.new_zeros((len(rows), kv_heads, longest, dim))
    v = v0.new_zeros((len(rows), kv_heads, longest, dim))
    for i, r in enumerate(rows):
        kr, vr = (k0, v0) if i == 0 else read_kv(r, first[i])
        k[i, :, first[i]] = kr
        v[i, :, first[i]] = vr
    index = torch.tensor([int(query_start[r]) for r in rows], device=query.device)
    q = query.index_select(0, index)[:, :, None, :]  # [B, H_Q, 1, D]
    pos = torch.tensor(positions, device=query.device)
    found = superlinear_search(q, k, pos[:, None], impl=config.impl, **kwargs)
    for i, r in enumerate(rows):
        spans = span_positions(found.span_start[i], found.span_end[i]).to(query.device)
        if spans.numel():
            k[i, :, spans], v[i, :, spans] = read_kv(r, spans)
    res = superlinear_decode(q, q, k, v, pos, scale=scale, impl=config.impl, **kwargs)
    out.index_copy_(0, index, res[:, :, 0, :].to(out.dtype))
