"""Driver (run by test_cuda_backend.py in a real vLLM venv): the CUDA backend on CPU tensors.

Usage: ``python cuda_driver.py MODEL_DIR`` with ``TRITON_INTERPRET=1`` and a ``triton`` importable;
writes a JSON result to ``$TOOLKIT_TEST_RESULT_FILE``.  Everything is vLLM's own: the config
(``VllmConfig`` of a config-only model directory), the KV cache spec, the backend's metadata builder
(``build``, ``build_for_cudagraph_capture``) fed vLLM's ``CommonAttentionMetadata``, the impl's
``forward`` on vLLM's logical cache tensor ``[num_blocks, H_KV, block_size, 2 D]`` with a GPU
physical layout (NHD or HND strides).  The one stand-in: vLLM's cache write is a Triton kernel that
vLLM's CPU build disables (its Triton placeholder), so K/V are written into the same slots of the
same views with torch indexing.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo, for the result channel
from tests.harness.channel import write_result  # noqa: E402
from tests.harness.host_reads import plain, request_data  # noqa: E402

sys.path.pop(0)

HQ, HKV, D, BS = 4, 2, 32, 16
COVERING = {"sw_index": 7, "backward_factor": 8.0, "forward_factor": 8.0}
COVERING_LEN = 168


def make_cache(num_blocks: int, layout: str) -> torch.Tensor:
    """vLLM's logical cache tensor with the strides of a GPU physical layout, filled with NaN."""
    if layout == "NHD":  # blocks, tokens, heads, 2D in memory
        storage = torch.full((num_blocks, BS, HKV, 2 * D), float("nan"))
        return storage.permute(0, 2, 1, 3)
    return torch.full((num_blocks, HKV, BS, 2 * D), float("nan"))  # HND


def write_cache(kv_cache, key, value, slots) -> None:
    """What ``triton_reshape_and_cache_flash`` does, on the views ``TritonAttentionImpl`` hands it."""
    key_cache, value_cache = kv_cache.transpose(1, 2).split(D, dim=-1)  # (blocks, tokens, heads, D)
    blk, off = slots // BS, slots % BS
    key_cache[blk, off] = key
    value_cache[blk, off] = value


class Batch:
    """Requests (decodes first, as the builder's reorder asks), their dense K/V and a paged cache."""

    def __init__(self, seq_lens, query_lens, layout, seed, extra_blocks=3):
        g = torch.Generator().manual_seed(seed)
        self.seq_lens, self.query_lens = list(seq_lens), list(query_lens)
        need = [-(-n // BS) for n in seq_lens]
        num_blocks = sum(need) + extra_blocks
        order = torch.randperm(num_blocks, generator=g)
        width = max(need) + 2
        self.block_table = torch.zeros(len(seq_lens), width, dtype=torch.int32)
        self.kv_cache = make_cache(num_blocks, layout)
        self.dense, at = [], 0
        self.slots = []
        for r, n in enumerate(seq_lens):
            blocks = order[at:at + need[r]]
            at += need[r]
            self.block_table[r, :need[r]] = blocks.to(torch.int32)
            self.block_table[r, need[r]:] = order[-1]  # entries past the end point at a NaN block
            k = (torch.randint(-8, 9, (n, HKV, D), generator=g).float() / 4)
            v = torch.randn(n, HKV, D, generator=g)
            pos = torch.arange(n)
            slots = blocks.long()[pos // BS] * BS + pos % BS
            write_cache(self.kv_cache, k, v, slots)
            self.slots.append(slots)
            self.dense.append((k.transpose(0, 1), v.transpose(0, 1)))
        self.query = (torch.randint(-8, 9, (sum(query_lens), HQ, D), generator=g).float() / 4)
        self.starts = [0]
        for c in query_lens:
            self.starts.append(self.starts[-1] + c)

    def common(self, CommonAttentionMetadata):
        qs = torch.tensor(self.starts, dtype=torch.int32)
        slot_mapping = torch.cat([s[n - c:] for s, n, c in zip(self.slots, self.seq_lens, self.query_lens)])
        return CommonAttentionMetadata(
            query_start_loc=qs, query_start_loc_cpu=qs.clone(), seq_lens=torch.tensor(self.seq_lens, dtype=torch.int32),
            num_reqs=len(self.seq_lens), num_actual_tokens=self.starts[-1], max_query_len=max(self.query_lens),
            max_seq_len=max(self.seq_lens), block_table_tensor=self.block_table, slot_mapping=slot_mapping)

    def reference(self, params: dict, dense: bool = False) -> torch.Tensor:
        from toolkit.kernels.superlinear.dispatch import superlinear_attention

        out = torch.empty_like(self.query)
        for r, (n, c) in enumerate(zip(self.seq_lens, self.query_lens)):
            k, v = self.dense[r]
            lo, hi = self.starts[r], self.starts[r + 1]
            q = self.query[lo:hi].transpose(0, 1)[None]
            if dense:  # plain causal attention, float64
                kk, vv = (x.double().repeat_interleave(HQ // HKV, 0) for x in (k, v))
                mask = torch.arange(n)[None, :] <= torch.arange(n - c, n)[:, None]
                ref = torch.nn.functional.scaled_dot_product_attention(q.double(), kk[None], vv[None], attn_mask=mask)
            else:
                ref = superlinear_attention(q, q, k[None], v[None], torch.arange(n - c, n), impl="naive", **params)
            out[lo:hi] = ref[0].transpose(0, 1).float()
        return out


def main() -> None:
    from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
    from vllm.platforms.interface import DeviceCapability
    from vllm.v1.attention.backend import CommonAttentionMetadata
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    from toolkit.patches.vllm.superlinear.plugin import registrations

    from toolkit.kernels.superlinear.triton import paged_decode, paged_prefill

    results: dict = {"interpreted": os.environ.get("TRITON_INTERPRET") == "1", "kernels_interpreted": all(
        type(k).__name__ == "InterpretedFunction"
        for k in (paged_prefill._paged_search_kernel, paged_decode._paged_decode_span_kernel))}
    vllm_config = VllmConfig(model_config=ModelConfig(model=sys.argv[1], dtype="float32", max_model_len=1024,
                                                      skip_tokenizer_init=True))
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=HKV, head_size=D, dtype=torch.float32)

    # What vLLM's CUDA platform does with --attention-backend CUSTOM: the registered class, validated.
    register_backend(AttentionBackendEnum.CUSTOM, registrations(on_cpu=False)["CUSTOM"])
    backend = AttentionBackendEnum.CUSTOM.get_class()
    results["backend"] = f"{backend.__module__}.{backend.__qualname__}"
    results["name_maps_back"] = AttentionBackendEnum[backend.get_name()] is AttentionBackendEnum.CUSTOM
    wanted = dict(head_size=128, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16, use_mla=False,
                  has_sink=False, use_sparse=False, use_mm_prefix=False, use_per_head_quant_scales=False,
                  device_capability=DeviceCapability(9, 0), attn_type="decoder")
    accepted = inspect.signature(backend.validate_configuration).parameters
    args = {k: v for k, v in wanted.items() if k in accepted}
    results["invalid_reasons"] = backend.validate_configuration(**args)
    results["invalid_reasons_fp8"] = backend.validate_configuration(**{**args, "kv_cache_dtype": "fp8"})
    builder_cls = backend.get_builder_cls()
    results["cudagraph_support"] = builder_cls.get_cudagraph_support(vllm_config, spec).name

    def impl_for(params: dict, **layer):
        os.environ["TOOLKIT_SUPERLINEAR_CONFIG"] = json.dumps({**params, "impl": os.environ.get("IMPL", "triton")})
        return backend.get_impl_cls()(num_heads=HQ, head_size=D, scale=D ** -0.5, num_kv_heads=HKV,
                                      alibi_slopes=None, sliding_window=layer.get("sliding_window"),
                                      kv_cache_dtype="auto")

    def run(batch: Batch, impl, metadata) -> torch.Tensor:
        tokens = batch.query.shape[0]
        output = torch.full((tokens + 2, HQ * D), float("nan"))  # the engine's buffer is padded
        query = torch.cat([batch.query, torch.zeros(2, HQ, D)])
        impl.forward(None, query, None, None, batch.kv_cache, metadata, output)
        return output[:tokens].view(tokens, HQ, D)

    def err(a, b) -> float:
        return float((a - b).abs().max())

    with set_current_vllm_config(vllm_config):
        builder = builder_cls(spec, [], vllm_config, torch.device("cpu"))
        results["reorder_batch_threshold"] = builder.reorder_batch_threshold
        results["window_layer_served"] = impl_for({}, sliding_window=64).use_superlinear
        cases = {}
        mixed = ([97, 260, 33, 300, 150], [1, 1, 1, 64, 150])  # 3 decodes, a chunk over a cached prefix, a prompt
        for layout in ("NHD", "HND"):
            for name, params in (("default", {}), ("window_spans", {"sw_index": 2, "topk": 2, "forward_factor": 1.0})):
                batch = Batch(*mixed, layout, seed=len(cases))
                metadata = builder.build(0, batch.common(CommonAttentionMetadata))
                out = run(batch, impl_for(params), metadata)
                cases[f"{layout}/{name}"] = {"num_decodes": metadata.num_decodes,
                                             "vs_naive": err(out, batch.reference(params))}
            n = COVERING_LEN
            batch = Batch([n, 100, n, n - 40], [1, 1, n, 30], layout, seed=9)
            metadata = builder.build(0, batch.common(CommonAttentionMetadata))
            out = run(batch, impl_for(COVERING), metadata)
            cases[f"{layout}/covering"] = {"num_decodes": metadata.num_decodes,
                                           "vs_dense": err(out, batch.reference(COVERING, dense=True)),
                                           "vs_naive": err(out, batch.reference(COVERING))}
        # A captured decode graph: metadata built once for capture (seq_lens 1), then replayed with
        # new lengths written into the same tensors, as vLLM's persistent buffers are.
        params = {"sw_index": 3, "topk": 3}
        batch = Batch([120, 301, 64], [1, 1, 1], "NHD", seed=11)
        metadata = builder.build_for_cudagraph_capture(batch.common(CommonAttentionMetadata))
        impl = impl_for(params)
        captured = run(batch, impl, metadata)
        first_values = torch.stack([batch.dense[r][1][:, 0].repeat_interleave(HQ // HKV, 0) for r in range(3)])
        metadata.seq_lens.copy_(torch.tensor(batch.seq_lens, dtype=torch.int32))
        replayed = run(batch, impl, metadata)
        # The step a CUDA graph replays reads no request data on the host: queries, cache, block
        # table, lengths and query starts as RequestData (any host read of them raises).
        guarded = dataclasses.replace(metadata, seq_lens=request_data(metadata.seq_lens),
                                      block_table=request_data(metadata.block_table),
                                      query_start_loc=request_data(metadata.query_start_loc))
        tokens = batch.query.shape[0]
        output = torch.full((tokens, HQ * D), float("nan"))
        try:
            impl.forward(None, request_data(batch.query), None, None, request_data(batch.kv_cache), guarded, output)
            no_host_read = err(plain(output).view(tokens, HQ, D), batch.reference(params))
        except AssertionError as exc:
            no_host_read = str(exc)
        cases["graph_decode"] = {"num_decodes": metadata.num_decodes, "capture_vs_first_value": err(captured, first_values),
                                 "replay_vs_naive": err(replayed, batch.reference(params)),
                                 "replay_no_host_read_vs_naive": no_host_read}
        results["cases"] = cases
    write_result(results)


if __name__ == "__main__":
    main()
