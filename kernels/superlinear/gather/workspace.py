"""Pieces every step of the gather path shares: sizes, scratch buffers, a batch row's keys, inputs.

All arithmetic is float32 whatever the input dtype.  The big temporaries live in a ``Workspace``
reused across chunks: a fresh multi-megabyte tensor per chunk costs as much in page faults (first
touch of new pages) as the gather that fills it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..attention_spans import (
    SuperlinearParams,
    check_positions,
    key_start,
    normalize_key_mask,
    normalize_positions,
    span_geometry,
)

# float32 elements allowed in one temporary (gathered search keys; search scores and tile masks):
# 16 MiB measured fastest on the 2-core box (4x larger ones fall out of cache and are ~25% slower;
# much smaller ones multiply the torch ops, each a synchronisation point of the intra-op pool).
TEMP_ELEMENTS = 1 << 22
SELECT_ELEMENTS = 1 << 22
BLOCK_K = 32
TILE_PAIRS = 192
QUERY_CHUNK = 8192

NEG_INF = float("-inf")


def chunks(total: int, size: int):
    size = max(1, size)
    for lo in range(0, total, size):
        yield lo, min(total, lo + size)


class Workspace:
    """Named scratch buffers that grow as needed and are reused by later chunks."""

    def __init__(self, device: torch.device):
        self.device = device
        self.buffers: dict[str, torch.Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype: torch.dtype = torch.float32) -> torch.Tensor:
        numel = math.prod(shape)
        buf = self.buffers.get(name)
        if buf is None or buf.numel() < numel or buf.dtype != dtype:
            buf = self.buffers[name] = torch.empty(numel, dtype=dtype, device=self.device)
        return buf[:numel].view(shape)


@dataclass
class KeyRow:
    """The keys of one batch row, in the layouts the steps read."""

    k_flat: torch.Tensor  # [H_KV * L_KV, D] fp32 (search and window gathers)
    v_flat: torch.Tensor
    k_blocks: torch.Tensor  # [H_KV * blocks, BLOCK_K * D], zero-padded to whole blocks (span tiles)
    v_blocks: torch.Tensor
    mask: torch.Tensor | None  # [L_KV] bool
    col_bias: torch.Tensor | None  # [blocks * BLOCK_K] 0 / -inf
    kv_heads: int
    key_len: int
    blocks: int
    native_layout: tuple[torch.Tensor, torch.Tensor] | None = None  # native_spans.key_layout, made at first use

    @classmethod
    def build(cls, k_row: torch.Tensor, v_row: torch.Tensor, mask: torch.Tensor | None,
              block_k: int = BLOCK_K) -> "KeyRow":
        kv_heads, key_len, dim = k_row.shape
        blocks = -(-key_len // block_k)
        pad = blocks * block_k - key_len
        k32 = k_row.float().contiguous()
        v32 = v_row.float().contiguous()
        if pad:
            k_pad = torch.nn.functional.pad(k32, (0, 0, 0, pad))
            v_pad = torch.nn.functional.pad(v32, (0, 0, 0, pad))
        else:
            k_pad, v_pad = k32, v32
        col_bias = None
        if mask is not None:
            col_bias = torch.where(torch.nn.functional.pad(mask, (0, pad), value=False), 0.0, NEG_INF)
        return cls(k32.view(-1, dim), v32.view(-1, dim), k_pad.view(kv_heads * blocks, block_k * dim),
                   v_pad.view(kv_heads * blocks, block_k * dim), mask, col_bias, kv_heads, key_len, blocks)


def mask_at(key_mask: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``key_mask`` at key positions ``idx``: a row's mask ``[L]`` at any ``idx``, or a batch's
    ``[B, L]`` at ``idx`` ``[B, ...]`` (row b's positions in row b)."""
    if key_mask.dim() == 1:
        return key_mask[idx]
    return torch.gather(key_mask, 1, idx.reshape(idx.shape[0], -1)).view(idx.shape)


def offset_positions(base: torch.Tensor, offsets: torch.Tensor, key_mask: torch.Tensor | None):
    """Key positions ``base[..., None] + offsets`` clamped at 0, and which are real keys (>= 0 and
    true in ``key_mask``): the stripes (offsets ``1 - F(i)``) and the window (``1 - W .. 0``) of
    each query, prefill and decode alike."""
    idx = base[..., None] + offsets
    valid = idx >= 0
    idx = idx.clamp(min=0)
    if key_mask is not None:
        valid &= mask_at(key_mask, idx)
    return idx, valid


def row_keys(k: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``k`` ``[B, H_KV, L, D]`` at positions ``idx`` ``[B, H_KV or 1, n]`` of each row: ``[B, H_KV, n, D]`` fp32."""
    batch, kv_heads = k.shape[:2]
    bidx = torch.arange(batch, device=k.device)[:, None, None]
    hidx = torch.arange(kv_heads, device=k.device)[None, :, None]
    return k[bidx, hidx, idx].float()


def prepare(q1, q2, k, v, cache_position, attention_mask, params, scale):
    """Validated inputs of an entry point: params, positions ``[B, L_Q]``, key mask, first real key,
    span tables, scale."""
    params = params or SuperlinearParams()
    batch, heads, query_len, dim = q2.shape
    kv_heads, key_len = k.shape[1], k.shape[2]
    if heads % kv_heads:
        raise ValueError(f"H_Q={heads} is not a multiple of H_KV={kv_heads}")
    device = q2.device
    positions = normalize_positions(cache_position, batch, query_len, key_len, device)
    check_positions(positions, key_len)
    key_mask = normalize_key_mask(attention_mask, batch, key_len, device)
    start = key_start(key_mask, batch, key_len, device)
    geometry = span_geometry(params, key_len, device)
    scale = 1.0 / math.sqrt(dim) if scale is None else float(scale)
    return params, positions, key_mask, start, geometry, scale
