"""Superlinear attention as a vLLM attention backend on CUDA (``--attention-backend CUSTOM``).

It is vLLM's Triton attention backend (``TRITON_ATTN``) with another ``forward``: same paged KV
cache (the logical ``[num_blocks, H_KV, block_size, 2 * D]`` tensor with whatever physical layout
vLLM resolved), same cache write (``do_kv_cache_update``), same block tables, so the scheduler,
chunked prefill, prefix caching and the KV manager are vLLM's.  Causal decoder layers run the
kernels' paged interface (``toolkit.kernels.superlinear.paged``) on the cache views directly, no
copy of any request's prefix:

* the metadata builder asks vLLM to put decode requests first (``reorder_batch_threshold = 1``)
  and counts them; their rows go through ``superlinear_decode_paged`` (static shapes, no host
  synchronisation: vLLM captures uniform decode batches in full CUDA graphs,
  ``AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE``);
* prompts and prefill chunks (over a cached prefix too) through ``superlinear_attention_paged``
  (mixed batches run eagerly between vLLM's piecewise graphs).

Layers the kernels do not serve (encoder, cross-attention, sliding window, ALiBi, sinks,
soft-capping, quantized caches, multimodal bidirectional ranges, R-SWA) keep vLLM's Triton kernel,
with a warning.  ``impl`` from the configuration picks the kernels (``auto``: Triton on CUDA
tensors; ``gather`` runs the PyTorch path on the same cache).

Runs inside vLLM's processes: imports vLLM, torch and the kernels, nothing of the patch engine.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import ClassVar

from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.attention.backends.triton_attn import (
    TritonAttentionBackend,
    TritonAttentionImpl,
    TritonAttentionMetadata,
    TritonAttentionMetadataBuilder,
)
from vllm.v1.attention.backends.utils import split_decodes_and_prefills

from toolkit.kernels.superlinear.paged import PagedKV
from toolkit.patches.common.superlinear.ragged import superlinear_ragged
from toolkit.patches.vllm.superlinear.layers import engine_config, serves_layer


@dataclass
class SuperlinearCUDAMetadata(TritonAttentionMetadata):
    """vLLM's Triton metadata plus how many requests there are and how many (first) are decodes."""

    num_reqs: int = 0
    num_decodes: int = 0


class SuperlinearCUDAMetadataBuilder(TritonAttentionMetadataBuilder):
    # Full CUDA graphs for batches of single-token decodes; everything else piecewise (eager attention).
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_SINGLE_TOKEN_DECODE

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self._init_reorder_batch_threshold(1)  # decodes first: one decode launch for all of them

    def build(self, common_prefix_len, common_attn_metadata, fast_build: bool = False):
        base = super().build(common_prefix_len, common_attn_metadata, fast_build)
        num_decodes, _, _, _ = split_decodes_and_prefills(common_attn_metadata, decode_threshold=1)
        return SuperlinearCUDAMetadata(
            **{f.name: getattr(base, f.name) for f in fields(TritonAttentionMetadata)},
            num_reqs=common_attn_metadata.num_reqs, num_decodes=num_decodes,
        )


class SuperlinearCUDAAttentionImpl(TritonAttentionImpl):
    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.superlinear = engine_config()
        quantized = self.kv_cache_dtype not in ("auto", "float16", "bfloat16", "float32", "half", "float")
        self.use_superlinear = serves_layer(self, quantized or self._is_per_token_head_quant,
                                           "vLLM's Triton attention")

    def forward(self, layer, query, key, value, kv_cache, attn_metadata, output,
                output_scale=None, output_block_scale=None):
        if (not self.use_superlinear or attn_metadata is None or output_scale is not None
                or output_block_scale is not None or not isinstance(attn_metadata, SuperlinearCUDAMetadata)
                or attn_metadata.causal is not True or attn_metadata.mm_prefix_range_tensor is not None
                or attn_metadata.rswa_prefix_lens is not None):
            return super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                   output_scale, output_block_scale)
        num_tokens = attn_metadata.num_actual_tokens
        num_reqs = attn_metadata.num_reqs
        # The logical cache is (blocks, H_KV, block_size, 2 D): its two halves are the kernels'
        # [num_blocks, H_KV, block_size, D] views, with the strides of vLLM's physical layout.
        key_cache, value_cache = kv_cache.split(self.head_size, dim=-1)
        kv = PagedKV.from_blocks(key_cache, value_cache, attn_metadata.block_table[:num_reqs],
                                 attn_metadata.seq_lens[:num_reqs])
        q = query[:num_tokens].view(num_tokens, self.num_heads, self.head_size)
        out = output[:num_tokens].view(num_tokens, self.num_heads, self.head_size)
        superlinear_ragged(q, kv, attn_metadata.query_start_loc, self.superlinear, self.scale, out,
                           num_decodes=attn_metadata.num_decodes, max_seq_len=kv.capacity)
        return output


class SuperlinearCUDABackend(TritonAttentionBackend):
    """``TRITON_ATTN`` with superlinear attention (same cache, same cache write, same metadata)."""

    supported_kv_cache_dtypes: ClassVar[list] = ["auto", "float16", "bfloat16"]

    @staticmethod
    def get_name() -> str:
        # The enum member it is registered as: vLLM maps the name back to AttentionBackendEnum.
        return "CUSTOM"

    @staticmethod
    def get_impl_cls():
        return SuperlinearCUDAAttentionImpl

    @staticmethod
    def get_builder_cls():
        return SuperlinearCUDAMetadataBuilder
