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
from vllm.config import get_current_vllm_config
from vllm.logger import init_logger
from vllm.platforms import current_platform
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.cpu_attn import (
    CPUAttentionBackend,
    CPUAttentionBackendImpl,
    CPUAttentionMetadata,
    CPUAttentionMetadataBuilder,
)

from toolkit.patches.common.superlinear.config import load_config
from toolkit.patches.vllm.superlinear.paged import (
    layout_from_probe,
    read_blocks,
    read_positions,
    split_kv_cache,
)
from toolkit.patches.common.superlinear.ragged import superlinear_ragged

# A child of the "vllm" logger: vLLM configures handlers for its own namespace only.
logger = init_logger("vllm.toolkit_superlinear")

ADDITIONAL_CONFIG_KEY = "superlinear"


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


def engine_config():
    """The validated configuration: environment, then vLLM's ``additional_config["superlinear"]``."""
    additional = getattr(get_current_vllm_config(), "additional_config", None) or {}
    section = additional.get(ADDITIONAL_CONFIG_KEY) if isinstance(additional, dict) else None
    return load_config(engine_config=section, engine_source=f"--additional-config {ADDITIONAL_CONFIG_KEY!r}")


class SuperlinearCPUAttentionImpl(CPUAttentionBackendImpl):
    _layouts: ClassVar[dict] = {}

    def __init__(self, *args, **kwargs) -> None:
        if not current_platform.is_cpu():
            raise NotImplementedError(
                "superlinear attention for vLLM is built on vLLM's CPU attention backend and runs on CPU "
                "only in this release (docs/superlinear.md); use a dense --attention-backend on GPU")
        super().__init__(*args, **kwargs)
        self.superlinear = engine_config()
        reasons = []
        if self.attn_type != AttentionType.DECODER:
            reasons.append(f"attention type {self.attn_type}")
        if self.sliding_window not in (-1, None):
            reasons.append("sliding window")
        if self.alibi_slopes is not None:
            reasons.append("ALiBi")
        if self.sinks is not None:
            reasons.append("attention sinks")
        if self.logits_soft_cap:
            reasons.append("logit soft-capping")
        if self.is_fp8_kv_cache:
            reasons.append("fp8 KV cache")
        self.use_superlinear = not reasons
        if reasons:
            logger.warning_once("superlinear attention: a layer keeps vLLM's CPU attention (%s)", ", ".join(reasons))
        else:
            logger.info_once("superlinear attention on (%s)", self.superlinear.describe())

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
        block_table = attn_metadata.block_table

        def fetch_kv(r: int, n: int):
            return (read_blocks(key_cache, block_table[r], n, k_perm),
                    read_blocks(value_cache, block_table[r], n, v_perm))

        q = query[:num_tokens].view(num_tokens, self.num_heads, self.head_size)
        out = output[:num_tokens].view(num_tokens, self.num_heads, self.head_size)
        def read_kv(r: int, positions: torch.Tensor):
            return (read_positions(key_cache, block_table[r], positions, k_perm),
                    read_positions(value_cache, block_table[r], positions, v_perm))

        superlinear_ragged(q, attn_metadata.query_start_list, attn_metadata.seq_len_list, fetch_kv, read_kv,
                           self.superlinear, self.scale, out)
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
