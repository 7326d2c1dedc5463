"""The ``hybrid-kv-cache-wake`` declaration: one vLLM file, one transformer, no runtime."""

from toolkit.declare import FileEdit, Patch

CODEMODS = "toolkit_catalog.vllm.hybrid_kv_cache_wake.codemods"

PATCH = Patch(
    id="hybrid-kv-cache-wake",
    engine="vllm",
    # vLLM 0.24.0-0.26.0: the releases whose wake path zeroes each KV-cache entry as one tensor.
    versions=">=0.24.0,<=0.26.0",
    files=(FileEdit("v1/worker/gpu_model_runner.py", (f"{CODEMODS}:GPUModelRunnerTransformer",)),),
    summary="waking a hybrid model (Mamba, DeltaNet layers) with an FP8 KV cache zeroes each tensor of a "
            "list entry instead of raising AttributeError ('list' object has no attribute 'zero_')",
    not_needed=(">=0.27.0", "vLLM 0.27 zeroes list entries itself (vllm-project/vllm#41602, the fix SkyRL "
                            "backports); from 0.29 the wake path no longer has this loop"),
)
