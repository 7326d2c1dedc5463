"""Superlinear attention over a serving batch: ragged requests whose K/V live in an engine's cache.

Engine-agnostic (vLLM's paged blocks and SGLang's token pool both come in through ``fetch_kv``):
the batch is the flattened query tokens of several requests, request ``r`` owning rows
``query_start[r]:query_start[r+1]`` at the last positions of its ``seq_lens[r]`` tokens (the cache
already holds the K/V of those rows). Prefill rows (several per request: a prompt or a chunk of one)
go through ``superlinear_attention`` one request at a time; single-token rows (decode) of all
requests go through one ``superlinear_decode`` call. Search and attention use the same query (models
with one query projection).

Imports torch and the kernels only.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from kernels.superlinear.api import superlinear_attention, superlinear_decode
from patches.vllm.superlinear.config import SuperlinearConfig

# fetch_kv(r, n) -> (k, v), each [H_KV, >= n, D]: the first n cached tokens of request r, in order.
FetchKV = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


def superlinear_ragged(query: torch.Tensor, query_start: Sequence[int], seq_lens: Sequence[int],
                       fetch_kv: FetchKV, config: SuperlinearConfig, scale: float,
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
        _decode(query, query_start, seq_lens, decodes, fetch_kv, config, scale, out, kwargs)
    return out


def _decode(query, query_start, seq_lens, rows, fetch_kv, config, scale, out, kwargs) -> None:
    longest = max(int(seq_lens[r]) for r in rows)
    first_k, first_v = fetch_kv(rows[0], int(seq_lens[rows[0]]))
    kv_heads, dim = first_k.shape[0], first_k.shape[-1]
    k = first_k.new_zeros((len(rows), kv_heads, longest, dim))
    v = first_v.new_zeros((len(rows), kv_heads, longest, dim))
    for i, r in enumerate(rows):
        n = int(seq_lens[r])
        kr, vr = (first_k, first_v) if i == 0 else fetch_kv(r, n)
        k[i, :, :n] = kr[:, :n]
        v[i, :, :n] = vr[:, :n]
    index = torch.tensor([int(query_start[r]) for r in rows], device=query.device)
    q = query.index_select(0, index)[:, :, None, :]  # [B, H_Q, 1, D]
    positions = torch.tensor([int(seq_lens[r]) - 1 for r in rows], device=query.device)
    res = superlinear_decode(q, q, k, v, positions, scale=scale, impl=config.impl, **kwargs)
    out.index_copy_(0, index, res[:, :, 0, :].to(out.dtype))
