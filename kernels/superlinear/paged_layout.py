"""Block layouts of a paged cache: where (token t, dim d) of one (block, head) is stored.

Inside one (block, head) an engine may store a block's ``block_size x D`` elements in any order
(vLLM's CPU ``vec`` kernels store keys transposed).  A permutation gives that order: ``perm[t * D +
d]`` is the element offset, from the start of the (block, head), of token ``t`` dim ``d``.

* :func:`layout_from_probe` learns the permutations of an engine by writing known values through its
  cache write;
* :func:`inner_layout_of_perm` turns one into what the kernels read: strides when it is an affine
  map (transposed, row-major), else the table itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

# Digits of a probe value: small integers are exact in fp32, bf16 and fp16 alike.
PROBE_BASE = 16


@dataclass(frozen=True)
class InnerLayout:
    """How (token t, dim d) of one (block, head) is addressed: strides, or a permutation table."""

    stride_token: int
    stride_dim: int
    perm: torch.Tensor | None  # int32 [block_size * D] on the cache's device, or None (strides)


_PERM_LAYOUTS: dict[tuple, tuple[torch.Tensor, InnerLayout]] = {}


def inner_layout_of_perm(perm: torch.Tensor, block_size: int, dim: int, cache: torch.Tensor) -> InnerLayout:
    """Strides when ``perm`` is affine in (t, d) (row-major, transposed), else the table itself.

    Offsets are relative to a (block, head) whose ``block_size * D`` elements are contiguous (the
    view ``PagedKV.read_positions`` takes), so they are in units of the cache's element stride along D.
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
