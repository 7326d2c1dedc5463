"""Superlinear attention as a vLLM attention backend (CPU), registered by :mod:`.plugin`.

It is vLLM's own CPU backend (``CPU_ATTN``) with a different ``forward``: same KV cache shape and
layout, same cache write, same block tables and metadata, so everything around attention (the
scheduler, chunked prefill, prefix caching, the KV manager) is unchanged. Causal decoder layers
without a sliding window, ALiBi, sinks or soft-capping read each request's K/V back from the paged
cache through its block table and run ``toolkit.kernels.superlinear`` (the gather path on CPU, Triton on
CUDA tensors); every other layer (encoder, cross-attention, windowed layers) keeps vLLM's kernel.

Runs inside vLLM's processes: imports vLLM, torch and the kernels, nothing of the patch engine.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

import torch
from vllm import _custom_ops as ops
from vllm.platforms import current_platform
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadata,
    CPUAttentionMetadataBuilder,
)

from toolkit.kernels.superlinear.paged import PagedKV, layout_from_probe
from toolkit.patches.common.superlinear.ragged import superlinear_ragged
from toolkit.patches.vllm.superlinear.cpu_cache import split_kv_cache
from toolkit.patches.vllm.superlinear.layers import engine_config, serves_layer


@dataclass
class SuperlinearCPUMetadata(CPUAttentionMetadata):
    """vLLM's CPU metadata plus the per-request query starts and lengths as host lists."""

    query_start_list: list[int] | None = None
    seq_len_list: list[int] | None = None


class SuperlinearCPUMetadataBuilder(CPUAttentionMetadataBuilder):
    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False):
        base = super().build(common_prefix_len, common_attn_metadata, fast_build)
        num_reqs = common_attn_metadata.num_reqs
        return SuperlinearCPUMetadata(
            **{f.name: getattr(base, f.name) for f in fields(CPUAttentionMetadata)},
            query_start_list=base.query_start_loc[: num_reqs + 1].tolist(),
            seq_len_list=base.seq_lens[:num_reqs].tolist(),
        )


class SuperlinearCPUAttentionImpl(CPUAttentionBackendImpl):
    _layouts: ClassVar[dict] = {}

    def __init__(self, *args, **kwargs) -> None:
        if not current_platform.is_cpu():
            raise NotImplementedError(
                "the superlinear CPU backend runs on CPU only; on a GPU the plugin registers the CUDA "
                "backend as --attention-backend CUSTOM (docs/superlinear.md)")
        super().__init__(*args, **kwargs)
        self.superlinear = engine_config()
        self.use_superlinear = serves_layer(self, self.is_fp8_kv_cache, "vLLM's CPU attention")

    def _layout(self, isa: str, dtype: torch.dtype, block_size: int, head_dim: int):
        key = (isa, dtype, block_size, head_dim)
        if key not in self._layouts:
            def write(k, v, key_cache, value_cache, slots):
                ops.cpu_attn_reshape_and_cache(k, v, key_cache, value_cache, slots, isa,
                                               k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")
            self._layouts[key] = layout_from_probe(write, block_size, head_dim, dtype)
        return self._layouts[key]

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        if (not self.use_superlinear or attn_metadata is None or output_scale is not None
                or output_block_scale is not None or not isinstance(attn_metadata, SuperlinearCPUMetadata)
                or not attn_metadata.causal or attn_metadata.dynamic_causal is not None):
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                   output_scale, output_block_scale)
        num_tokens = attn_metadata.num_actual_tokens
        key_cache, value_cache = split_kv_cache(kv_cache)
        block_size, head_dim = key_cache.shape[2], key_cache.shape[3]
        k_perm, v_perm = self._layout(getattr(layer, "isa", "vec"), kv_cache.dtype, block_size, head_dim)
        num_reqs = len(attn_metadata.seq_len_list)
        kv = PagedKV.from_blocks(key_cache, value_cache, attn_metadata.block_table[:num_reqs],
                                 attn_metadata.seq_lens[:num_reqs], k_perm, v_perm)
        q = query[:num_tokens].view(num_tokens, self.num_heads, self.head_size)
        out = output[:num_tokens].view(num_tokens, self.num_heads, self.head_size)
        superlinear_ragged(q, kv, attn_metadata.query_start_list, self.superlinear, self.scale, out)
        return output


class SuperlinearCPUBackend(CPUAttentionBackend):
    """``CPU_ATTN`` with superlinear attention (same cache, same metadata)."""

    supported_kv_cache_dtypes: ClassVar[list] = ["auto"]

    @staticmethod
    def get_name() -> str:
        # The enum member it stands in for: vLLM maps the name back to AttentionBackendEnum.
        return "CPU_ATTN"

    @staticmethod
    def get_impl_cls():
        return SuperlinearCPUAttentionImpl

    @staticmethod
    def get_builder_cls():
        return SuperlinearCPUMetadataBuilder
