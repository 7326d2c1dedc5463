"""Superlinear attention over an engine's paged KV cache: one interface for every path and engine.

An engine keeps K/V in fixed-size blocks (vLLM: ``[num_blocks, H_KV, block_size, D]`` per layer, a
block table per request) or in a token pool (SGLang: ``[num_slots, H_KV, D]`` and ``req_to_token``
index rows, i.e. blocks of one token).  :class:`PagedKV` describes either, and the two entry points
take it:

* :func:`superlinear_attention_paged`: a serving batch of ragged query rows (prompts, prefill chunks
  over a cached prefix, single-token rows), request ``r`` owning query rows
  ``query_start[r]:query_start[r + 1]`` at the last positions of its ``seq_lens[r]`` cached tokens
  (the engine has already written those rows' K/V).
* :func:`superlinear_decode_paged`: one query per request at position ``seq_lens[r] - 1``.

Implementations (``impl`` as in ``api``):

* ``gather`` / ``naive`` (CPU, any device): what the engines' backends did through
  ``fetch_kv``/``read_kv``: a prompt or chunk reads its request's prefix into a contiguous copy and
  runs ``superlinear_attention``; single-token rows read only their stripes and window, then the
  spans the search picks (O(sqrt t) keys), into zero-filled buffers, and run one
  ``superlinear_decode`` for all of them.  :meth:`PagedKV.read_prefix` / :meth:`PagedKV.read_positions`
  are those two reads (drop-ins for ``fetch_kv(r, n)`` / ``read_kv(r, positions)``).
* ``triton``: kernels that read K and V straight from the cache through the block table
  (``triton/paged_prefill.py``, ``triton/paged_decode.py``); no copy of any request's prefix.

Block layouts.  Inside one (block, head) an engine may store a block's ``block_size x D`` elements in
any order (vLLM's CPU ``vec`` kernels store keys transposed).  ``key_perm`` / ``value_perm`` give that
order: ``perm[t * D + d]`` is the element offset, from the start of the (block, head), of token ``t``
dim ``d`` (what ``layout_from_probe`` learns); ``None`` means the cache view's own strides.  A
permutation that is an affine map (transposed, row-major) is turned into strides for the kernels;
any other is read through the table.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch

from .api import (
    make_params,
    resolve_impl,
    superlinear_attention,
    superlinear_decode,
    superlinear_search,
)
from .attention_spans import SpanGeometry, span_geometry

# Digits of a probe value: small integers are exact in fp32, bf16 and fp16 alike.
PROBE_BASE = 16
# The CPU decode buffers are rounded up to this many keys (the gather path's per-row key layout is
# then a view of the buffer, not a padded copy).
KEY_ALIGN = 256


@dataclass(frozen=True)
class InnerLayout:
    """How (token t, dim d) of one (block, head) is addressed: strides, or a permutation table."""

    stride_token: int
    stride_dim: int
    perm: torch.Tensor | None  # int32 [block_size * D] on the cache's device, or None (strides)


@dataclass(frozen=True, eq=False)
class PagedKV:
    """K/V of a batch of requests in an engine's paged cache (one layer).

    * ``key_cache`` / ``value_cache``: ``[num_blocks, H_KV, block_size, D]`` (views with any strides;
      a token pool is ``block_size == 1``, see :meth:`from_token_pool`).
    * ``block_table``: ``[rows, max_blocks]`` int: block ids of a request's tokens, in token order
      (entries past a request's last block are never read).
    * ``seq_lens``: ``[R]`` int: tokens cached per request (its queries are the last ones).
    * ``table_rows``: ``[R]`` int or None: request ``r`` uses ``block_table[table_rows[r]]``
      (SGLang's ``req_pool_indices``); None: row ``r``.
    * ``key_perm`` / ``value_perm``: the layout of a block (module docstring); None: the view's strides.

    Nothing here reads tensor data: constructing one is free and CUDA-graph safe.
    """

    key_cache: torch.Tensor
    value_cache: torch.Tensor
    block_table: torch.Tensor
    seq_lens: torch.Tensor
    table_rows: torch.Tensor | None = None
    key_perm: torch.Tensor | None = None
    value_perm: torch.Tensor | None = None

    def __post_init__(self) -> None:
        k, v = self.key_cache, self.value_cache
        if k.dim() != 4 or v.dim() != 4:
            raise ValueError("key_cache and value_cache must be [num_blocks, H_KV, block_size, D] "
                             "(use PagedKV.from_token_pool for a [num_slots, H_KV, D] pool)")
        if k.shape != v.shape:
            raise ValueError(f"key_cache {tuple(k.shape)} and value_cache {tuple(v.shape)} differ")
        if self.block_table.dim() != 2:
            raise ValueError(f"block_table must be [rows, max_blocks], got {tuple(self.block_table.shape)}")
        for name in ("block_table", "seq_lens", "table_rows"):
            t = getattr(self, name)
            if t is not None and (t.dtype.is_floating_point or t.dtype == torch.bool):
                raise ValueError(f"{name} must be an integer tensor, got {t.dtype}")
        if self.seq_lens.dim() != 1:
            raise ValueError(f"seq_lens must be [R], got {tuple(self.seq_lens.shape)}")
        if self.table_rows is not None and self.table_rows.shape != self.seq_lens.shape:
            raise ValueError(f"table_rows {tuple(self.table_rows.shape)} must match seq_lens "
                             f"{tuple(self.seq_lens.shape)}")
        n = self.block_size * self.head_dim
        for name in ("key_perm", "value_perm"):
            perm = getattr(self, name)
            if perm is not None and perm.numel() != n:
                raise ValueError(f"{name} has {perm.numel()} entries, expected block_size * D = {n}")

    # -- construction ------------------------------------------------------------------------------

    @classmethod
    def from_blocks(cls, key_cache: torch.Tensor, value_cache: torch.Tensor, block_table: torch.Tensor,
                    seq_lens: torch.Tensor, key_perm: torch.Tensor | None = None,
                    value_perm: torch.Tensor | None = None) -> "PagedKV":
        """A block cache (vLLM): ``[num_blocks, H_KV, block_size, D]`` and one table row per request."""
        return cls(key_cache, value_cache, block_table, seq_lens, None, key_perm, value_perm)

    @classmethod
    def from_token_pool(cls, k_pool: torch.Tensor, v_pool: torch.Tensor, req_to_token: torch.Tensor,
                        req_pool_indices: torch.Tensor, seq_lens: torch.Tensor) -> "PagedKV":
        """A token pool (SGLang): ``[num_slots, H_KV, D]`` and ``req_to_token[req_pool_indices[r]]``."""
        if k_pool.dim() != 3 or v_pool.dim() != 3:
            raise ValueError("token pools must be [num_slots, H_KV, D]")
        return cls(k_pool.unsqueeze(2), v_pool.unsqueeze(2), req_to_token, seq_lens, req_pool_indices)

    # -- shape -------------------------------------------------------------------------------------

    @property
    def num_requests(self) -> int:
        return int(self.seq_lens.shape[0])

    kv_heads = property(lambda self: int(self.key_cache.shape[1]), doc="H_KV")
    block_size = property(lambda self: int(self.key_cache.shape[2]), doc="tokens per block (1: a token pool)")
    head_dim = property(lambda self: int(self.key_cache.shape[3]), doc="D")

    @property
    def capacity(self) -> int:
        """Most tokens a request can hold (``max_blocks * block_size``): a static bound on positions."""
        return int(self.block_table.shape[1]) * self.block_size

    def narrow(self, start: int, count: int) -> "PagedKV":
        """Requests ``start .. start + count - 1`` only (views, no copy; e.g. a batch's decode rows)."""
        if start == 0 and count == self.num_requests:
            return self
        stop = start + count
        if self.table_rows is None:
            return replace(self, block_table=self.block_table[start:stop], seq_lens=self.seq_lens[start:stop])
        return replace(self, seq_lens=self.seq_lens[start:stop], table_rows=self.table_rows[start:stop])

    def request_table_rows(self) -> torch.Tensor:
        """int32 ``[R]``: the block-table row of each request (device op, no host read)."""
        if self.table_rows is None:
            return torch.arange(self.num_requests, dtype=torch.int32, device=self.block_table.device)
        return self.table_rows.to(device=self.block_table.device, dtype=torch.int32)

    def inner_layout(self, which: str) -> InnerLayout:
        """Layout of keys (``"key"``) or values (``"value"``) inside a (block, head), for the kernels."""
        cache = self.key_cache if which == "key" else self.value_cache
        perm = self.key_perm if which == "key" else self.value_perm
        if perm is None:
            return InnerLayout(cache.stride(2), cache.stride(3), None)
        return _layout_of_perm(perm, self.block_size, self.head_dim, cache)

    # -- reads (CPU path; the ``fetch_kv`` / ``read_kv`` of patches/common/superlinear/ragged.py) ---

    def _blocks(self, r: int) -> torch.Tensor:
        row = r if self.table_rows is None else int(self.table_rows[r])
        return self.block_table[row]

    def read_prefix(self, r: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Request ``r``'s first ``n`` tokens: (k, v), each ``[H_KV, n, D]`` (a contiguous copy)."""
        blocks = self._blocks(r)
        return (_read_blocks(self.key_cache, blocks, n, self.key_perm),
                _read_blocks(self.value_cache, blocks, n, self.value_perm))

    def read_positions(self, r: int, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Request ``r``'s tokens at ``positions`` (int ``[n]``): (k, v), each ``[H_KV, n, D]``."""
        blocks = self._blocks(r)
        positions = positions.to(device=self.key_cache.device, dtype=torch.int64)
        return (_read_positions(self.key_cache, blocks, positions, self.key_perm),
                _read_positions(self.value_cache, blocks, positions, self.value_perm))


_PERM_LAYOUTS: dict[tuple, tuple[torch.Tensor, InnerLayout]] = {}


def _layout_of_perm(perm: torch.Tensor, block_size: int, dim: int, cache: torch.Tensor) -> InnerLayout:
    """Strides when ``perm`` is affine in (t, d) (row-major, transposed), else the table itself.

    Offsets are relative to a (block, head) whose ``block_size * D`` elements are contiguous (the
    view ``_read_positions`` takes), so they are in units of the cache's element stride along D.
    """
    if cache.stride(3) != 1 or cache.stride(2) != dim:
        raise ValueError("a block permutation needs each (block, head) stored as block_size * D "
                         "contiguous elements")
    # Keyed by the tensor object (kept alive in the entry, so its id is not reused; a layout table is
    # never written after the probe, and an inference-mode tensor has no version counter): the
    # analysis reads the table on the host once per permutation, not once per call.
    key = (id(perm), block_size, dim, cache.device)
    hit = _PERM_LAYOUTS.get(key)
    if hit is not None:
        return hit[1]
    table = perm.detach().to("cpu", torch.int64).view(block_size, dim)
    st = int(table[1, 0] - table[0, 0]) if block_size > 1 else 0
    sd = int(table[0, 1] - table[0, 0]) if dim > 1 else 0
    affine = int(table[0, 0]) == 0 and torch.equal(
        table, torch.arange(block_size)[:, None] * st + torch.arange(dim)[None, :] * sd)
    layout = (InnerLayout(st, sd, None) if affine
              else InnerLayout(0, 0, perm.to(device=cache.device, dtype=torch.int32).contiguous()))
    if len(_PERM_LAYOUTS) > 64:
        _PERM_LAYOUTS.clear()
    _PERM_LAYOUTS[key] = (perm, layout)
    return layout


def _read_blocks(cache: torch.Tensor, blocks: torch.Tensor, num_tokens: int, perm: torch.Tensor | None) -> torch.Tensor:
    """Tokens ``0..num_tokens-1`` through ``blocks`` from ``cache`` ``[num_blocks, H, bs, D]``: ``[H, n, D]``."""
    _, heads, block_size, dim = cache.shape
    used = blocks[: -(-num_tokens // block_size)].to(device=cache.device, dtype=torch.int64)
    raw = cache.index_select(0, used)  # [nb, H, bs, D], contiguous copy of whole blocks
    if perm is not None:
        raw = raw.view(used.numel(), heads, block_size * dim).index_select(2, perm.to(raw.device, torch.int64))
        raw = raw.view(used.numel(), heads, block_size, dim)
    return raw.permute(1, 0, 2, 3).reshape(heads, used.numel() * block_size, dim)[:, :num_tokens]


def _read_positions(cache: torch.Tensor, blocks: torch.Tensor, positions: torch.Tensor,
                    perm: torch.Tensor | None) -> torch.Tensor:
    """Tokens at ``positions`` (int64 ``[n]``) through ``blocks``: ``[H, n, D]``."""
    _, heads, block_size, dim = cache.shape
    blk = blocks.to(device=cache.device, dtype=torch.int64)[positions // block_size]
    off = positions % block_size
    if perm is None:
        return cache[blk, :, off].transpose(0, 1)
    flat = cache.view(cache.shape[0], heads, block_size * dim)
    idx = perm.to(cache.device, torch.int64).view(block_size, dim)[off]  # [n, D] offsets inside a block
    head = torch.arange(heads, device=cache.device)
    return flat[blk[:, None, None], head[None, :, None], idx[:, None, :]].transpose(0, 1)


def layout_from_probe(write: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None],
                      block_size: int, head_dim: int, dtype: torch.dtype,
                      make_cache: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] | None = None,
                      ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Block layouts ``(key_perm, value_perm)`` learned by writing known values through the engine.

    ``write(key, value, key_cache, value_cache, slot_mapping)`` must be the engine's cache write
    (``key``/``value`` ``[block_size, 1, D]``, slots ``0..block_size-1`` of block 0).  ``make_cache``
    returns ``(storage, key_cache, value_cache)`` for one block and one head, filled with -1
    (default: vLLM's CPU cache, ``[1, 1, bs, 2D]`` split into key and value halves).  Returns
    ``None`` for a row-major layout.  Raises if the layout is not a permutation of the block.
    """
    n = block_size * head_dim
    source = torch.arange(n, dtype=torch.int64)
    digits = 1
    while PROBE_BASE ** digits < n:
        digits += 1
    if make_cache is None:
        def make_cache():
            storage = torch.full((1, 1, block_size, 2 * head_dim), -1.0, dtype=dtype)
            key_cache, value_cache = storage.view(1, 1, block_size * 2, head_dim).chunk(2, dim=2)
            return storage, key_cache, value_cache
    found = [torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64)]
    slots = torch.arange(block_size, dtype=torch.int64)
    for j in range(digits):
        digit = (source // PROBE_BASE ** j) % PROBE_BASE
        tokens = digit.view(block_size, 1, head_dim).to(dtype)
        storage, key_cache, value_cache = make_cache()
        write(tokens, tokens.clone(), key_cache, value_cache, slots)
        flat = storage.view(-1).float()
        for which, part in enumerate((flat[:n], flat[n:2 * n])):
            if bool((part < 0).any()) or bool((part >= PROBE_BASE).any()):
                raise RuntimeError("superlinear: the engine's KV cache layout is not a permutation of each block "
                                   "(unsupported cache dtype or ISA); use the dense backend")
            found[which] += part.round().to(torch.int64) * PROBE_BASE ** j
    perms: list[torch.Tensor | None] = []
    for stored in found:
        # stored[slot] = source index held at that slot; invert it.
        if not torch.equal(torch.sort(stored).values, source):
            raise RuntimeError("superlinear: the engine's KV cache layout is not a permutation of each block; "
                               "use the dense backend")
        perm = torch.empty(n, dtype=torch.int64)
        perm[stored] = source
        perms.append(None if torch.equal(perm, source) else perm)
    return perms[0], perms[1]


# --------------------------------------------------------------------------------------------------
# CPU path (gather / naive): reads through the table, then the contiguous kernels


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


def _param_kwargs(params) -> dict:
    return dict(sw_index=params.sw_index, topk=params.topk, backward_factor=params.backward_factor,
                forward_factor=params.forward_factor, span_power=params.span_power,
                search_power=params.search_power, inv_search_power_int=params.inv_search_power_int)


def _cpu_attention_paged(q1, q2, kv: PagedKV, query_start, params, scale, impl, out):
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


# --------------------------------------------------------------------------------------------------
# Entry points


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
    return _cpu_attention_paged(q1, query, kv, query_start, params, scale, which, out)


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
    seq_lens = _host_ints(kv.seq_lens)
    rows = [r for r, n in enumerate(seq_lens) if n > 0]
    empty = [r for r, n in enumerate(seq_lens) if n <= 0]
    if empty:
        out[empty] = 0
    if rows:
        index = torch.tensor(rows, device=query.device)
        res = _decode_rows(q1.index_select(0, index), query.index_select(0, index), kv, rows, seq_lens,
                           params, scale, which)
        out.index_copy_(0, index, res.to(out.dtype))
    return out
