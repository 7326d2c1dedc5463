"""Reading one request's K/V out of vLLM's paged CPU cache (no vLLM import: unit-testable alone).

vLLM's CPU cache is ``[num_blocks, H_KV, block_size, 2 * D]``: per (block, head), ``block_size * D``
key elements then as many value elements. How the key elements are ordered inside a block depends
on the CPU kernel's ISA (the ``vec`` kernels store a block's keys transposed, ``[D, block_size]``),
so the backend learns each layout once by writing known values through vLLM's own cache-write op
(:func:`layout_from_probe`) and reads through the resulting permutation. ``None`` means row-major
``[block_size, D]`` (no permutation).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# Digits of a probe value: small integers are exact in fp32, bf16 and fp16 alike.
PROBE_BASE = 16


def split_kv_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[num_blocks, H, bs, 2D]`` -> key and value views ``[num_blocks, H, bs, D]`` (as vLLM's CPU backend)."""
    num_blocks, heads, block_size, _ = kv_cache.shape
    return kv_cache.view(num_blocks, heads, block_size * 2, -1).chunk(2, dim=2)


def layout_from_probe(write: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None],
                      block_size: int, head_dim: int, dtype: torch.dtype) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """Permutations ``perm`` with ``block_flat[perm[t * D + d]] == token t, dim d`` for keys and values.

    ``write(key, value, key_cache, value_cache, slot_mapping)`` must be the engine's cache write
    (``key``/``value`` ``[N, 1, D]``). Raises if the layout is not a permutation of the block.
    """
    n = block_size * head_dim
    source = torch.arange(n, dtype=torch.int64)
    digits = 1
    while PROBE_BASE ** digits < n:
        digits += 1
    found = [torch.zeros(n, dtype=torch.int64), torch.zeros(n, dtype=torch.int64)]
    slots = torch.arange(block_size, dtype=torch.int64)
    for j in range(digits):
        digit = (source // PROBE_BASE ** j) % PROBE_BASE
        tokens = digit.view(block_size, 1, head_dim).to(dtype)
        cache = torch.full((1, 1, block_size, 2 * head_dim), -1.0, dtype=dtype)
        key_cache, value_cache = split_kv_cache(cache)
        write(tokens, tokens.clone(), key_cache, value_cache, slots)
        flat = cache.view(-1).float()
        for which, part in enumerate((flat[:n], flat[n:])):
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


def read_blocks(cache: torch.Tensor, blocks: torch.Tensor, num_tokens: int, perm: torch.Tensor | None) -> torch.Tensor:
    """Tokens ``0..num_tokens-1`` of a request from ``cache`` ``[num_blocks, H, bs, D]``: ``[H, num_tokens, D]``."""
    _, heads, block_size, dim = cache.shape
    used = blocks[: -(-num_tokens // block_size)].to(torch.int64)
    raw = cache.index_select(0, used)  # [nb, H, bs, D], contiguous copy
    if perm is not None:
        raw = raw.view(used.numel(), heads, block_size * dim).index_select(2, perm.to(raw.device))
        raw = raw.view(used.numel(), heads, block_size, dim)
    return raw.permute(1, 0, 2, 3).reshape(heads, used.numel() * block_size, dim)[:, :num_tokens]


def read_positions(cache: torch.Tensor, blocks: torch.Tensor, positions: torch.Tensor,
                   perm: torch.Tensor | None) -> torch.Tensor:
    """A request's tokens at ``positions`` (int64 ``[n]``) from ``cache`` ``[num_blocks, H, bs, D]``: ``[H, n, D]``."""
    _, heads, block_size, dim = cache.shape
    blk = blocks.to(torch.int64)[positions // block_size]
    off = positions % block_size
    if perm is None:
        return cache[blk, :, off].transpose(0, 1)
    flat = cache.view(cache.shape[0], heads, block_size * dim)
    idx = perm.to(cache.device).view(block_size, dim)[off]  # [n, D] element offsets inside a block
    head = torch.arange(heads, device=cache.device)
    return flat[blk[:, None, None], head[None, :, None], idx[:, None, :]].transpose(0, 1)
