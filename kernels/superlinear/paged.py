"""Superlinear attention over an engine's paged KV cache: one interface for every path and engine.

The cache is described by :class:`PagedKV` (``paged_kv``: vLLM's blocks and block table, or
SGLang's token pool), and the two entry points take it:

* :func:`superlinear_attention_paged`: a serving batch of ragged query rows (prompts, prefill chunks
  over a cached prefix, single-token rows), request ``r`` owning query rows
  ``query_start[r]:query_start[r + 1]`` at the last positions of its ``seq_lens[r]`` cached tokens
  (the engine has already written those rows' K/V).
* :func:`superlinear_decode_paged`: one query per request at position ``seq_lens[r] - 1``.

Implementations (``impl`` as in ``dispatch``):

* ``gather`` / ``naive`` (CPU, any device): ``paged_cpu`` reads through the table with
  :meth:`PagedKV.read_prefix` / :meth:`PagedKV.read_positions` (drop-ins for ``fetch_kv(r, n)`` /
  ``read_kv(r, positions)``), then runs the contiguous kernels.
* ``triton``: kernels that read K and V straight from the cache through the block table
  (``triton/paged_prefill.py``, ``triton/paged_decode.py``); no copy of any request's prefix.

Block layouts (any permutation of a block's ``block_size x D`` elements, learned by
``layout_from_probe``) are ``paged_layout``'s.  ``PagedKV``, ``layout_from_probe`` and the CPU
path's ``decode_positions`` / ``span_positions`` are importable from here too, where the engines'
backends and the tests take them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from .dispatch import make_params, resolve_impl
from .paged_cpu import cpu_attention_paged, cpu_decode_paged, decode_positions, span_positions
from .paged_kv import PagedKV
from .paged_layout import InnerLayout, layout_from_probe

__all__ = [
    "InnerLayout",
    "PagedKV",
    "decode_positions",
    "layout_from_probe",
    "span_positions",
    "superlinear_attention_paged",
    "superlinear_decode_paged",
]


def _check_query(query: torch.Tensor, search_query: torch.Tensor | None, kv: PagedKV) -> None:
    if query.dim() != 3:
        raise ValueError(f"query must be [tokens, H_Q, D], got {tuple(query.shape)}")
    if search_query is not None and search_query.shape != query.shape:
        raise ValueError(f"search_query {tuple(search_query.shape)} must match query {tuple(query.shape)}")
    if query.shape[2] != kv.head_dim:
        raise ValueError(f"query head dim {query.shape[2]} != cache head dim {kv.head_dim}")
    if query.shape[1] % kv.kv_heads:
        raise ValueError(f"H_Q={query.shape[1]} must be a multiple of H_KV={kv.kv_heads}")
    if query.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype {query.dtype} not supported (fp32, bf16, fp16)")


def _call_setup(query, search_query, out, impl, **params):
    """(validated params, search query, output tensor, implementation) of an entry point."""
    q1 = query if search_query is None else search_query
    if out is None:
        out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    return make_params(**params), q1, out, resolve_impl(impl, query.device)


def superlinear_attention_paged(
    query: torch.Tensor, kv: PagedKV, query_start: torch.Tensor | Sequence[int],
    search_query: torch.Tensor | None = None, *,
    sw_index: int = 0, topk: int = 3, backward_factor: float = 2.0, forward_factor: float = 0.0,
    span_power: float = 0.5, search_power: float | None = None, inv_search_power_int: int | None = None,
    scale: float | None = None, impl: str | None = "auto", out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Superlinear attention of a ragged serving batch whose K/V are in ``kv``: ``[T, H_Q, D]``.

    ``query`` ``[T, H_Q, D]`` (attention query; ``search_query`` the search query, default the same);
    ``query_start`` ``[R + 1]``: request ``r`` owns rows ``query_start[r]:query_start[r + 1]``, at
    positions ``seq_lens[r] - count .. seq_lens[r] - 1``.  Rows past ``query_start[R]`` (padding)
    get 0 on the Triton path.  ``out`` (optional, ``[T, H_Q, D]``, any float dtype) is written and
    returned.  Equals ``superlinear_attention`` run request by request over the same keys.

    Triton: one search, one span-tile and one merge launch for the whole batch, plus a few torch ops;
    no host synchronisation.  Single-token rows are correct here but each reads its whole prefix in
    one tile; use :func:`superlinear_decode_paged` for decode rows.
    """
    _check_query(query, search_query, kv)
    params, q1, out, which = _call_setup(query, search_query, out, impl, sw_index=sw_index, topk=topk,
                                         backward_factor=backward_factor, forward_factor=forward_factor,
                                         span_power=span_power, search_power=search_power,
                                         inv_search_power_int=inv_search_power_int)
    if which == "triton":
        from .triton.paged_prefill import triton_superlinear_attention_paged

        if not isinstance(query_start, torch.Tensor):
            query_start = torch.tensor(list(query_start), dtype=torch.int64, device=query.device)
        return triton_superlinear_attention_paged(q1, query, kv, query_start, params, scale, out)
    return cpu_attention_paged(q1, query, kv, query_start, params, scale, which, out)


def superlinear_decode_paged(
    query: torch.Tensor, kv: PagedKV, search_query: torch.Tensor | None = None, *,
    sw_index: int = 0, topk: int = 3, backward_factor: float = 2.0, forward_factor: float = 0.0,
    span_power: float = 0.5, search_power: float | None = None, inv_search_power_int: int | None = None,
    scale: float | None = None, impl: str | None = "auto", out: torch.Tensor | None = None,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """One decode step per request: ``query`` ``[R, H_Q, D]``, row ``r`` at position ``seq_lens[r] - 1``.

    Returns ``[R, H_Q, D]`` (written into ``out`` when given).  A request with ``seq_len == 0`` (a
    padding row of a CUDA-graph batch) gets 0 on the Triton path.

    Triton: static shapes and no host synchronisation, so the step can be captured in a CUDA graph.
    What is static (fixed per captured graph): ``R``, ``H_Q``, ``H_KV``, ``D``, dtypes, the cache and
    block-table shapes, the parameters and ``max_seq_len`` (default ``kv.capacity`` =
    ``max_blocks * block_size``: it sizes the span-table lookups and the split-K grid, so every
    ``seq_len`` must stay ``<= max_seq_len``).  What may change between replays (read on the device
    only): ``seq_lens``, the block-table contents and ``table_rows``, the cache contents, the queries.
    """
    _check_query(query, search_query, kv)
    if query.shape[0] != kv.num_requests:
        raise ValueError(f"decode takes one query per request: {query.shape[0]} rows for {kv.num_requests} requests")
    params, q1, out, which = _call_setup(query, search_query, out, impl, sw_index=sw_index, topk=topk,
                                         backward_factor=backward_factor, forward_factor=forward_factor,
                                         span_power=span_power, search_power=search_power,
                                         inv_search_power_int=inv_search_power_int)
    if which == "triton":
        from .triton.paged_decode import triton_superlinear_decode_paged

        return triton_superlinear_decode_paged(q1, query, kv, params, scale, out,
                                               kv.capacity if max_seq_len is None else int(max_seq_len))
    return cpu_decode_paged(q1, query, kv, params, scale, which, out)
