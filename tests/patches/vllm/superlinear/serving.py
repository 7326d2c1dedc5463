"""Driving a real server for the superlinear tests (and scripts/bench_superlinear_server.py).

Prompts are token-id lists (exact lengths); greedy completions with the logprob of each generated
token and, optionally, of each prompt token. Standard library only (urllib, threads).
"""

from __future__ import annotations

import json
import math
import random
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

# The tiny model's ids 0..7 are its special and marker tokens; plain tokens start after them.
FIRST_PLAIN_ID = 8
VOCAB = 4096
# The covering configuration of the server tests: W = 63, spans of 8*sqrt(t) both ways; every query
# below 168 tokens attends its whole prefix (toolkit.patches.common.superlinear.config.covering_length).
COVERING_ENV = {
    "TOOLKIT_ATTENTION_BACKEND": "superlinear",
    "TOOLKIT_SUPERLINEAR_SW_INDEX": "7",
    "TOOLKIT_SUPERLINEAR_BACKWARD_FACTOR": "8",
    "TOOLKIT_SUPERLINEAR_FORWARD_FACTOR": "8",
}
COVERING_TOKENS = 168


def prompt_ids(length: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(FIRST_PLAIN_ID, VOCAB) for _ in range(length)]


@dataclass
class Completion:
    token_ids: list[int]
    logprobs: list[float]
    prompt_logprobs: list[float] | None
    seconds: float


def complete(base_url: str, model: str, ids: list[int], max_tokens: int, prompt_logprobs: bool = False,
             timeout: float = 600) -> Completion:
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1,
            "return_token_ids": True, "ignore_eos": True}
    if prompt_logprobs:
        body["prompt_logprobs"] = 0
    req = urllib.request.Request(base_url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        data = json.loads(resp.read())
    seconds = time.perf_counter() - start
    choice = data["choices"][0]
    plp = None
    if prompt_logprobs:
        plp = []
        for tok, entry in zip(ids[1:], choice["prompt_logprobs"][1:]):
            plp.append(entry[str(tok)]["logprob"])
    return Completion(choice["token_ids"], choice["logprobs"]["token_logprobs"], plp, seconds)


def complete_all(base_url: str, model: str, prompts: list[list[int]], max_tokens: int,
                 prompt_logprobs: bool = False, concurrent: bool = False) -> list[Completion]:
    if not concurrent:
        return [complete(base_url, model, p, max_tokens, prompt_logprobs) for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: complete(base_url, model, p, max_tokens, prompt_logprobs), prompts))


def max_gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def mean_gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a
    return math.fsum(abs(x - y) for x, y in zip(a, b)) / len(a)


def generate_sglang(base_url: str, ids: list[int], max_tokens: int, prompt_logprobs: bool = False,
                    timeout: float = 600) -> Completion:
    """The same through SGLang's native ``/generate`` (it has prompt logprobs and token-id prompts)."""
    body = {"input_ids": ids, "return_logprob": True, "logprob_start_len": 0 if prompt_logprobs else -1,
            "sampling_params": {"temperature": 0, "max_new_tokens": max_tokens, "ignore_eos": True}}
    req = urllib.request.Request(base_url + "/generate", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        data = json.loads(resp.read())
    seconds = time.perf_counter() - start
    meta = data["meta_info"]
    out = meta["output_token_logprobs"]
    plp = [entry[0] for entry in meta["input_token_logprobs"][1:]] if prompt_logprobs else None
    return Completion([entry[1] for entry in out], [entry[0] for entry in out], plp, seconds)


def generate_all_sglang(base_url: str, prompts: list[list[int]], max_tokens: int, prompt_logprobs: bool = False,
                        concurrent: bool = False) -> list[Completion]:
    def one(p):
        return generate_sglang(base_url, p, max_tokens, prompt_logprobs)
    if not concurrent:
        return [one(p) for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(one, prompts))


# --- what both engines' server tests send and check ----------------------------------------------

GEN = 12
COVERING_LENS = (40, 90, 130, 150)  # + GEN generated tokens stays below COVERING_TOKENS
LONG_LEN = 3900
LONG_GEN = 4
# Logprobs in the covering regime: the same math as dense, summed in another order (fp32).
ROUNDING = 2e-4
# Mean |prompt logprob gap| allowed on the long prompt (an approximation; tiny random model).
LONG_GAP = 0.25
# The long prompt in a batch vs alone (see assert_long_close): share of positions within ROUNDING, mean gap.
BATCH_WITHIN = 0.99
BATCH_MEAN_GAP = 1e-2


def covering_prompts() -> list[list[int]]:
    assert max(COVERING_LENS) + GEN <= COVERING_TOKENS
    return [prompt_ids(n, seed=n) for n in COVERING_LENS]


def long_prompts() -> list[list[int]]:
    return [prompt_ids(LONG_LEN, seed=1000 + i) for i in range(2)]


def assert_covering_equal(dense: list[Completion], got: list[Completion]) -> None:
    assert len(dense) == len(got)
    for ref, out in zip(dense, got):
        assert out.token_ids == ref.token_ids
        assert max_gap(out.logprobs, ref.logprobs) <= ROUNDING


def assert_long_close(dense_alone: Completion, alone: Completion, dense_together: list[Completion],
                      together: list[Completion]) -> float:
    """The long prompt alone and in a batch [it, another long one, short ones]; returns the mean gap.

    Plain asserts with messages: this module is not a test module, so pytest does not rewrite them."""
    assert len(alone.token_ids) == LONG_GEN and len(alone.prompt_logprobs) == LONG_LEN - 1, \
        (len(alone.token_ids), len(alone.prompt_logprobs))
    gap = mean_gap(alone.prompt_logprobs, dense_alone.prompt_logprobs)
    near = max_gap(alone.prompt_logprobs[:COVERING_TOKENS - 1], dense_alone.prompt_logprobs[:COVERING_TOKENS - 1])
    print(f"\nlong prompt ({LONG_LEN} tokens): mean |logprob gap| vs dense {gap:.4f} nats, "
          f"max {max_gap(alone.prompt_logprobs, dense_alone.prompt_logprobs):.4f}; "
          f"first {COVERING_TOKENS} tokens max {near:.2e}")
    assert near <= ROUNDING, f"the covered prefix differs from dense by {near:.2e}"
    assert gap < LONG_GAP, f"mean gap {gap:.4f} >= {LONG_GAP}"
    # In a batch, the same long prompt gives what it gives alone, to float rounding; the others are right
    # too. Beside other requests the engine may cut the prompt into other prefill chunks, so its queries
    # go through matmuls of other shapes: the rounding differs, and where two candidate spans score within
    # rounding of each other the search may pick the other one (a span flip), which moves that position's
    # logprob by more than rounding. So: nearly every position within rounding, a small mean, and the
    # same greedy tokens unless a flip was seen.
    gaps = [abs(x - y) for x, y in zip(together[0].prompt_logprobs, alone.prompt_logprobs)]
    within = sum(g <= ROUNDING for g in gaps) / len(gaps)
    batch_mean = math.fsum(gaps) / len(gaps)
    print(f"long prompt in a batch vs alone: {within:.2%} of positions within {ROUNDING:g}, mean gap "
          f"{batch_mean:.2e}, max {max(gaps):.2e}; generated {together[0].token_ids} vs {alone.token_ids}")
    assert within >= BATCH_WITHIN and batch_mean <= BATCH_MEAN_GAP, \
        f"long prompt in a batch vs alone: {within:.2%} of positions within {ROUNDING:g}, mean gap {batch_mean:.2e}"
    if within == 1.0:
        assert together[0].token_ids == alone.token_ids, ("long prompt in a batch vs alone", together[0].token_ids,
                                                          alone.token_ids)
    other_gap = mean_gap(together[1].prompt_logprobs, dense_together[1].prompt_logprobs)
    assert other_gap < LONG_GAP, f"second long prompt: mean gap {other_gap:.4f} vs dense"
    for i, (out, ref) in enumerate(zip(together[2:], dense_together[2:]), 2):
        assert out.token_ids == ref.token_ids, (f"short prompt {i} in the batch vs dense", out.token_ids, ref.token_ids)
        short_gap = max_gap(out.prompt_logprobs, ref.prompt_logprobs)
        assert short_gap <= ROUNDING, f"short prompt {i} in the batch: prompt logprobs differ from dense by {short_gap:.2e}"
    return gap
