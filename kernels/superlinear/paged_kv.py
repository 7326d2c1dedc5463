"""``PagedKV``: the K/V of a batch of requests in an engine's paged cache, and its reads.

An engine keeps K/V in fixed-size blocks (vLLM: ``[num_blocks, H_KV, block_size, D]`` per layer, a
block table per request) or in a token pool (SGLang: ``[num_slots, H_KV, D]`` and ``req_to_token``
index rows, i.e. blocks of one token).  :class:`PagedKV` describes either; the Triton kernels read
it through the block table, the CPU path through :meth:`PagedKV.read_prefix` /
:meth:`PagedKV.read_positions`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .paged_layout import InnerLayout, inner_layout_of_perm


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
    * ``key_perm`` / ``value_perm``: the layout of a block (``paged_layout``); None: the view's strides.

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
        return inner_layout_of_perm(perm, self.block_size, self.head_dim, cache)

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
