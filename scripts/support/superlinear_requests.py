"""Requests to a real vLLM or SGLang server for the superlinear tests and benchmarks
(scripts/bench_superlinear_server.py, scripts/bench_superlinear_gpu.py).

Prompts are token-id lists (exact lengths); greedy completions with the logprob of each generated
token and, optionally, of each prompt token. Standard library only (urllib, threads).
"""

from __future__ import annotations

import json
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


def post_json(url: str, body: dict, timeout: float) -> tuple[dict, float]:
    """The server's JSON answer to ``body`` and the seconds it took."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        data = json.loads(resp.read())
    return data, time.perf_counter() - start


def complete(base_url: str, model: str, ids: list[int], max_tokens: int, prompt_logprobs: bool = False,
             timeout: float = 600) -> Completion:
    body = {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1,
            "return_token_ids": True, "ignore_eos": True}
    if prompt_logprobs:
        body["prompt_logprobs"] = 0
    data, seconds = post_json(base_url + "/v1/completions", body, timeout)
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


def generate_sglang(base_url: str, ids: list[int], max_tokens: int, prompt_logprobs: bool = False,
                    timeout: float = 600) -> Completion:
    """The same through SGLang's native ``/generate`` (it has prompt logprobs and token-id prompts)."""
    body = {"input_ids": ids, "return_logprob": True, "logprob_start_len": 0 if prompt_logprobs else -1,
            "sampling_params": {"temperature": 0, "max_new_tokens": max_tokens, "ignore_eos": True}}
    data, seconds = post_json(base_url + "/generate", body, timeout)
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
