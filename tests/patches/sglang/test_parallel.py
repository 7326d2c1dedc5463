"""SGLang's patches under ``--tp 2`` and ``--dp 2`` (issue 31), SGLang 0.5.23 on CPU.

SGLang's CPU path runs two ranks on a one-NUMA-node machine when each rank gets CPUs of its own
(``SGLANG_CPU_OMP_THREADS_BIND="0|1"``; without it the scheduler stops at start: "the total number of
ranks ... should be smaller than or equal to number of numa node"). token-ids and tito edit only the
HTTP and OpenAI-serving files, which run in the one HTTP-server process whatever the ranks, so their
answers must be the single-process server's: `toolkit verify --url` passes every SGLang check (token ids
stream = non-stream and the template's prompt ids, tools, concurrency, input_ids, the multi-turn prefix
splice three turns with a tool call), and greedy ids equal the Hugging Face reference on the same weights.
A private copy of the venv's sglang is patched (private_sglang.py): the shared venv is never written.

The same servers run the superlinear attention backend (this project's ``sglang.srt.plugins`` entry
point, ``--attention-backend superlinear``) in its covering configuration (COVERING_ENV: every query
below 168 tokens attends its whole prefix), so each rank's scheduler loads the plugin and attends over
its own heads (TP) or whole requests (DP): the covering prompts' greedy tokens must be the reference's,
logprobs to float rounding, alone and at once. token-ids and tito do not depend on the attention backend
(they run in the HTTP server); verify's longer conversations go past the covering regime, where only its
own consistency checks apply, and the greedy check's prompt is well inside it.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from scripts.support.superlinear_requests import COVERING_ENV, generate_all_sglang
from tests.harness.fixtures import ensure_engine_python, one_cpu_per_rank, sglang_env, verify_url
from tests.patches.vllm.superlinear.serving import GEN, assert_covering_equals_the_reference, covering_reference
from tests.patches.sglang.token_ids.private_sglang import private_install

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

VERSION = "0.5.23"
PATCHES = ["token-ids", "tito"]
SGLANG_CHECKS = ("nonstream-decode", "stream-decode", "stream-parity", "tools", "prompt-template", "input-ids",
                 "concurrency", "multi-turn")  # responses-stream and patch-sweep are vLLM's


@pytest.fixture(scope="module", params=["--tp", "--dp"])
def parallel_server(request, tiny_model, tmp_path_factory) -> Iterator[tuple[str, str, object]]:
    """(base URL, the private copy's python, the EngineServer) of an SGLang server with two ranks, both
    patches applied."""
    from toolkit import apply_patch
    from toolkit.verify.server import EngineServer

    bind = one_cpu_per_rank()
    python = private_install(ensure_engine_python(f"sglang-{VERSION}"), tmp_path_factory.mktemp("sglang-parallel"))
    assert apply_patch(engine="sglang", patches=PATCHES, python=python)
    env = {**sglang_env(), "SGLANG_CPU_OMP_THREADS_BIND": bind}
    env.update(COVERING_ENV)
    args = [request.param, "2", "--tool-call-parser", "hermes", "--attention-backend", "superlinear",
            "--context-length", "4096", "--chunked-prefill-size", "512"]
    with EngineServer("sglang", python, tiny_model, args, env=env, timeout=600) as server:
        yield server.base_url, python, server


def test_verify_passes_every_sglang_check_on_two_ranks(parallel_server, tiny_model):
    base_url, python, _ = parallel_server
    multi_turn = verify_url(tiny_model, base_url, python, SGLANG_CHECKS, engine="sglang")["multi-turn"]
    assert multi_turn.startswith("turn 1 called get_weather; turn 2: prompt = ") and "turn 3: prompt = " in multi_turn


def test_greedy_ids_equal_the_reference_on_two_ranks(parallel_server, tiny_model):
    """Chat with token ids, then the same prompt as tito's input_ids: the template's prompt ids and the
    reference's greedy ids, whichever rank ran them."""
    import httpx

    from scripts.support.hf_reference import Reference, steered_greedy

    base_url, _, _ = parallel_server
    ref = Reference(tiny_model)
    chat = {"model": tiny_model, "messages": [{"role": "user", "content": "The cat sat on the mat."}],
            "max_tokens": 8, "temperature": 0, "return_token_ids": True, "ignore_eos": True}
    for _ in range(2):  # with --dp 2 the two requests may go to different ranks
        answer = httpx.post(f"{base_url}/v1/chat/completions", json=chat, timeout=120)
        assert answer.status_code == 200, answer.text
        prompt_ids, completion_ids = answer.json()["prompt_token_ids"], answer.json()["choices"][0]["token_ids"]
        templated = ref.tokenizer.apply_chat_template(chat["messages"], add_generation_prompt=True, tokenize=True)
        assert prompt_ids == list(templated["input_ids"] if isinstance(templated, dict) else templated)
        assert completion_ids == steered_greedy(ref, prompt_ids, 8, [])
        pretokenized = httpx.post(f"{base_url}/v1/chat/completions",
                                  json={**chat, "messages": [], "input_ids": prompt_ids}, timeout=120)
        assert pretokenized.status_code == 200, pretokenized.text
        assert pretokenized.json()["choices"][0]["token_ids"] == completion_ids


def test_superlinear_covering_regime_equals_the_reference_on_two_ranks(parallel_server, tiny_model):
    base_url, _, server = parallel_server
    reference = covering_reference(tiny_model)
    prompts = [ids for ids, _, _ in reference]
    assert_covering_equals_the_reference(reference, generate_all_sglang(base_url, prompts, GEN),
                                         generate_all_sglang(base_url, prompts, GEN, concurrent=True))
    log = server.log_tail(100000)  # each rank's scheduler built the backend (not a dense fallback)
    assert "superlinear attention on (sw_index=7" in log, log[-3000:]
