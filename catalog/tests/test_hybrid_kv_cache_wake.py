"""hybrid-kv-cache-wake (SkyRL) on a snippet in vLLM 0.24-0.26's shape (the real files are
test_conformance.py's), and its behaviour: the patched loop run on a hybrid model's KV-cache entries
(a tensor, a list of tensors, None), where the release's loop raises. Runs without vLLM."""

from __future__ import annotations

import textwrap

import pytest

from toolkit.testing import assert_codemod
from toolkit_catalog.vllm.hybrid_kv_cache_wake.codemods import UPSTREAM_LOOP, GPUModelRunnerTransformer
from toolkit_catalog.vllm.hybrid_kv_cache_wake.patch import PATCH

RELPATH = "v1/worker/gpu_model_runner.py"

BEFORE = '''
class GPUModelRunner(LoRAModelRunnerMixin):
    def init_fp8_kv_scales(self) -> None:
        if not is_quantized_kv_cache(self.cache_config.cache_dtype):
            return

        kv_caches = getattr(self, "kv_caches", [])
        for cache_tensor in kv_caches:
            if cache_tensor is not None:
                cache_tensor.zero_()

        k_attr_names = ("_k_scale", "k_scale")
'''

AFTER = '''
class GPUModelRunner(LoRAModelRunnerMixin):
    def init_fp8_kv_scales(self) -> None:
        if not is_quantized_kv_cache(self.cache_config.cache_dtype):
            return

        kv_caches = getattr(self, "kv_caches", [])
        for cache_entry in kv_caches:  # toolkit:hybrid-kv-cache-wake
            if cache_entry is None:
                continue
            # Hybrid models (Mamba, DeltaNet) store per-layer state as a
            # list of tensors rather than a single tensor.
            if isinstance(cache_entry, list):
                for tensor in cache_entry:
                    tensor.zero_()
            else:
                cache_entry.zero_()

        k_attr_names = ("_k_scale", "k_scale")
'''


def test_the_loop_zeroes_list_entries_and_the_rest_of_the_method_stays():
    assert_codemod(GPUModelRunnerTransformer, BEFORE, AFTER, engine_version="0.26.0", relpath=RELPATH,
                   patch_id=PATCH.id)


def test_vllm_0_27s_fixed_loop_fails_on_its_anchor_and_is_not_needed():
    fixed = AFTER.replace("  # toolkit:hybrid-kv-cache-wake", "")
    with pytest.raises(AssertionError, match="zero-loop"):
        assert_codemod(GPUModelRunnerTransformer, fixed, fixed, engine_version="0.27.0", relpath=RELPATH,
                       patch_id=PATCH.id)
    assert PATCH.not_needed_on("0.27.0") and not PATCH.not_needed_on("0.26.0")


class Tensor:
    """What the loop calls on a KV-cache tensor (torch is not in this environment): ``zero_``."""

    def __init__(self) -> None:
        self.zeroed = False

    def zero_(self) -> Tensor:
        self.zeroed = True
        return self


def test_a_hybrid_models_entries_are_all_zeroed_where_the_release_raises():
    attention, mamba_state = Tensor(), [Tensor(), Tensor()]
    kv_caches = [attention, None, mamba_state]
    release = "for cache_tensor in kv_caches:\n    if cache_tensor is not None:\n        cache_tensor.zero_()\n"
    with pytest.raises(AttributeError, match="'list' object has no attribute 'zero_'"):
        exec(release, {"kv_caches": kv_caches})
    exec(textwrap.dedent(UPSTREAM_LOOP), {"kv_caches": kv_caches})
    assert attention.zeroed and all(t.zeroed for t in mamba_state)
