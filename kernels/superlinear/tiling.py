"""Group (query, span) pairs into tiles that read the same key blocks.

Each selected span is a contiguous key range ``[lo, hi]``.  Sorting the pairs of one (batch row,
KV head) by the key block their span starts in, then cutting the sorted list every ``tile_size``
pairs, yields tiles whose spans overlap almost entirely: a tile reads key blocks
``first_block .. first_block + num_blocks - 1`` once for all its pairs, so QK^T and PV become
``[tile_size, D] x [D, num_blocks * block_k]`` matrix products instead of one mat-vec per pair
(the "bucketed" idea of the published package, without its sort into exact footprint buckets).

Pure torch ops with static output sizes: no host synchronisation, so the GPU path can build tiles
on the device; the CPU path groups the tiles by width afterwards.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class SpanTiles:
    pair_ids: torch.Tensor  # [n_tiles, tile_size] int64, -1 = empty slot
    group: torch.Tensor  # [n_tiles] int64, which (batch row, KV head) the tile reads
    first_block: torch.Tensor  # [n_tiles] int64
    num_blocks: torch.Tensor  # [n_tiles] int64, 0 for an empty tile

    @property
    def tile_size(self) -> int:
        return self.pair_ids.shape[1]


def max_tiles(num_pairs: int, num_groups: int, tile_size: int) -> int:
    """Upper bound on the tile count: each group's last tile may be partial."""
    return -(-num_pairs // tile_size) + num_groups


def build_span_tiles(span_lo: torch.Tensor, span_hi: torch.Tensor, group: torch.Tensor,
                     num_groups: int, key_len: int, block_k: int, tile_size: int) -> SpanTiles:
    """Tiles over the pairs ``p`` (flat arrays): span ``[span_lo[p], span_hi[p]]`` of group ``group[p]``.

    Pairs with ``span_hi < span_lo`` (no span) are left out.  Pair ids are positions in the flat
    arrays.
    """
    device = span_lo.device
    num_pairs = span_lo.numel()
    num_key_blocks = -(-key_len // block_k) + 1
    valid = span_hi >= span_lo
    first = torch.where(valid, span_lo, 0) // block_k
    last = torch.where(valid, span_hi, 0) // block_k
    grp = torch.where(valid, group, num_groups)  # empty pairs sort after every group
    sort_key = (grp * num_key_blocks + first) * num_key_blocks + last
    order = torch.sort(sort_key, stable=True).indices
    sorted_group = grp[order]
    sorted_valid = valid[order]

    # scatter_add, not bincount: CUDA bincount reads the maximum back to the host.
    counts = torch.zeros(num_groups + 1, dtype=torch.int64, device=device)
    counts.scatter_add_(0, grp, torch.ones_like(grp))
    counts = counts[:num_groups]
    padded = (counts + tile_size - 1) // tile_size * tile_size
    sorted_offset = torch.cumsum(counts, 0) - counts  # where each group starts in sorted order
    padded_offset = torch.cumsum(padded, 0) - padded  # where it starts in the tiled layout
    g = sorted_group.clamp(max=num_groups - 1)
    rank = torch.arange(num_pairs, device=device) - sorted_offset[g]
    slot = padded_offset[g] + rank
    n_tiles = max_tiles(num_pairs, num_groups, tile_size)
    dump = n_tiles * tile_size  # scatter target for empty pairs, dropped below
    slot = torch.where(sorted_valid, slot, dump)

    pair_ids = torch.full((dump + 1,), -1, dtype=torch.int64, device=device)
    pair_ids.scatter_(0, slot, order)
    pair_ids = pair_ids[:dump].view(n_tiles, tile_size)

    tile_of_slot = slot // tile_size  # dump slots land on tile n_tiles
    big = torch.iinfo(torch.int64).max
    first_block = torch.full((n_tiles + 1,), big, dtype=torch.int64, device=device)
    first_block.scatter_reduce_(0, tile_of_slot, first[order], reduce="amin")
    last_block = torch.full((n_tiles + 1,), -1, dtype=torch.int64, device=device)
    last_block.scatter_reduce_(0, tile_of_slot, last[order], reduce="amax")
    tile_group = torch.zeros(n_tiles + 1, dtype=torch.int64, device=device)
    tile_group.scatter_(0, tile_of_slot, g)
    first_block, last_block, tile_group = first_block[:n_tiles], last_block[:n_tiles], tile_group[:n_tiles]
    nonempty = last_block >= 0
    num_blocks = torch.where(nonempty, last_block - first_block + 1, 0)
    first_block = torch.where(nonempty, first_block, 0)
    return SpanTiles(pair_ids, tile_group, first_block, num_blocks)
