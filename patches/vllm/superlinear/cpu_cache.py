"""vLLM's paged CPU cache as the kernels' ``PagedKV`` views (no vLLM import: unit-testable alone).

vLLM's CPU cache is ``[num_blocks, H_KV, block_size, 2 * D]``: per (block, head), ``block_size * D``
key elements then as many value elements. How the key elements are ordered inside a block depends
on the CPU kernel's ISA (the ``vec`` kernels store a block's keys transposed, ``[D, block_size]``),
so the backend learns each layout once by writing known values through vLLM's own cache-write op
(``toolkit.kernels.superlinear.paged.layout_from_probe``) and hands the resulting permutations to
``PagedKV``, which reads (CPU) or addresses (Triton) through them.
"""

from __future__ import annotations

import torch


def split_kv_cache(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[num_blocks, H, bs, 2D]`` -> key and value views ``[num_blocks, H, bs, D]`` (as vLLM's CPU backend)."""
    num_blocks, heads, block_size, _ = kv_cache.shape
    key, value = kv_cache.view(num_blocks, heads, block_size * 2, -1).chunk(2, dim=2)
    return key, value
