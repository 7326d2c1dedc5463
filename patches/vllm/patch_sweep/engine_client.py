"""The API server's view of the engine for patch-sweep: worker RPCs, one scored request, captures.

Every cell of a sweep, every capture and both baselines are ordinary vLLM requests (``max_tokens=1``,
greedy, ``logprob_token_ids``); a plan rides to the worker as plain data in
``SamplingParams.extra_args`` (see ``worker.py``), stamped with a secret the workers get at install.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import math
import os
import secrets
import uuid
from typing import Any

from toolkit.patches.vllm.patch_sweep.refusals import BadRequest
from toolkit.patches.vllm.patch_sweep.shared import PLAN_KEY, WORKER_PREFIX

MAX_BYTES_ENV = "TOOLKIT_PATCH_RUNS_MAX_BYTES"  # the bound on each worker's stored runs
DEFAULT_MAX_BYTES = 256 << 20


class Engine:
    """The API server's view of the engine for patch-sweep (one per app: ``engine_of``)."""

    def __init__(self, client: Any):
        self.client = client
        self.secret = secrets.token_hex(16)
        self._request_prefix = f"patchsweep-{secrets.token_hex(8)}"  # + a counter: unique, cheaper than uuid4
        self._request_count = itertools.count()
        self.num_layers = 0
        self.embedding_std = 0.0
        self.batched_unsupported: str | None = None  # why the worker cannot run sweeps batched (None: it can)
        self.pinned_rank = pinned_data_parallel_rank(client)
        self._installed = False
        self._lock = asyncio.Lock()

    async def rpc(self, op: str, *args: Any, every_rank: bool = False) -> Any:
        """Call worker function ``op`` on every worker (each tensor-parallel rank runs the same hooks on
        the same, replicated residual stream); rank 0's answer, or every rank's with ``every_rank``."""
        results = await self.client.collective_rpc(WORKER_PREFIX + op, args=args)
        results = results if isinstance(results, list) else [results]
        return results if every_rank else results[0]

    async def ensure_installed(self) -> None:
        async with self._lock:
            if not self._installed:
                ranks = await self.rpc("install", self.secret, int(os.environ.get(MAX_BYTES_ENV, DEFAULT_MAX_BYTES)),
                                       every_rank=True)
                self.num_layers, self.embedding_std = merge_install(ranks)
                reasons = {rank.get("batched_unsupported") for rank in ranks} - {None}
                self.batched_unsupported = "; ".join(sorted(reasons)) or None
                self._installed = True

    async def tokenizer(self) -> Any:
        tokenizer = self.client.get_tokenizer()
        return await tokenizer if inspect.isawaitable(tokenizer) else tokenizer

    @property
    def vocab_size(self) -> int:
        return int(self.client.model_config.get_vocab_size())

    @property
    def max_model_len(self) -> int:
        return int(self.client.model_config.max_model_len)

    @property
    def hidden_size(self) -> int:
        return int(self.client.model_config.get_hidden_size())

    @property
    def item_size(self) -> int:
        dtype = self.client.model_config.dtype
        return int(getattr(dtype, "itemsize", 4))

    async def score(self, token_ids: list[int], scored: list[int], plan: dict[str, Any] | None = None,
                    sweep_salt: str | None = None) -> tuple[dict[int, float], int]:
        """Run ``token_ids`` as one request (patched/captured by ``plan``); the next-token logprobs of
        ``scored`` and how many prompt tokens came from the prefix cache. Without ``sweep_salt`` the
        request reads nothing from the prefix cache and its salt is its own; with it, the request shares
        the sweep's secret salt and reads the cache (a cell's plan then carries ``shared_prefix``, so
        only its blocks before that position are shared: see runtime.private_block_keys)."""
        from vllm import SamplingParams

        request_id = f"{self._request_prefix}-{next(self._request_count)}"
        extra = {PLAN_KEY: {**plan, "secret": self.secret}} if plan else None
        params = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=list(scored) or None,
                                extra_args=extra, skip_reading_prefix_cache=sweep_salt is None, detokenize=False)
        prompt = {"prompt_token_ids": list(token_ids), "cache_salt": sweep_salt or request_id}
        final = None
        pinned = {} if self.pinned_rank is None else {"data_parallel_rank": self.pinned_rank}
        async for output in self.client.generate(prompt, params, request_id, **pinned):
            final = output
        cached = int(getattr(final, "num_cached_tokens", 0) or 0)
        if not scored:
            return {}, cached
        if final is None:  # vLLM yields at least the finished output for every request it accepts
            raise RuntimeError(f"request {request_id} ended without an output")
        logprobs = final.outputs[0].logprobs[0]
        return {token: float(logprobs[token].logprob) for token in scored}, cached

    async def _record(self, token_ids: list[int], layers: list[int], hooks: list[str]) -> str:
        """One forward pass over ``token_ids`` recording (hook, layer) in the worker; the capture's key."""
        key = uuid.uuid4().hex
        plan = {"capture": key, "layers": layers, "hooks": hooks, "n": len(token_ids)}
        try:
            await self.score(token_ids, [], plan)  # captures are never shared: own salt, no cache read
        except BaseException:
            await self.rpc("discard", key)
            raise
        return key

    async def activations(self, token_ids: list[int], layers: list[int], hooks: list[str], positions: list[int]) -> dict:
        """The activations at (hook, layer) for ``positions``, taken from the worker as plain data."""
        return await self.rpc("take", await self._record(token_ids, layers, hooks), positions)

    async def capture(self, name: str, prompt: str, token_ids: list[int], layers: list[int], hooks: list[str]) -> dict:
        key = await self._record(token_ids, layers, hooks)
        info = await self.rpc("commit", key, name, prompt, token_ids)
        if "error" in info:
            raise BadRequest(info["error"])
        return info


def pinned_data_parallel_rank(client: Any) -> int | None:
    """The data-parallel rank every patch-sweep request goes to: 0 when the engine runs several
    (``--data-parallel-size``), else None (vLLM's own choice).

    A capture or stored run lives in the workers of the rank that ran it, and ``collective_rpc`` reaches
    every rank but answers with the first one's reply (vLLM's DP client: ``call_utility_async``). Left to
    the load balancer, a capture ran on rank 1 and its commit, answered by rank 0, found nothing (a 400),
    and a sweep of a run stored on rank 0 could run on rank 1 (a 409). Pinned to index 0, the rank whose
    reply the API server reads, every request and every reply are the same rank's; the other ranks get
    the calls too and answer for state they do not hold, which is never read. Chat and completions
    requests (steering included: it carries its vectors) stay balanced."""
    parallel = getattr(getattr(client, "vllm_config", None), "parallel_config", None)
    size = getattr(parallel, "data_parallel_size", 1)
    return 0 if isinstance(size, int) and size > 1 else None


def merge_install(ranks: list[dict[str, Any]]) -> tuple[int, float]:
    """The model's layer count and the standard deviation of its token embeddings (unbiased, as
    ``torch.std``) from every worker's install answer: with tensor parallelism each rank holds a slice of
    the embedding rows, so the moments are added up; every rank must see the same decoder stack."""
    layers = {int(rank["num_layers"]) for rank in ranks}
    if len(layers) != 1:
        raise BadRequest(f"the workers disagree on the number of decoder layers: {sorted(layers)}", status=500)
    count, total, squares = (sum(float(rank["embedding_moments"][i]) for rank in ranks) for i in range(3))
    variance = (squares - total * total / count) / (count - 1) if count > 1 else 0.0
    return layers.pop(), math.sqrt(max(variance, 0.0))


def engine_of(app: Any) -> Engine:
    """The app's Engine (one per app, made on first use: the engine client exists only once serving)."""
    state = app.state
    if getattr(state, "toolkit_patch_sweep", None) is None:
        state.toolkit_patch_sweep = Engine(state.engine_client)
    return state.toolkit_patch_sweep
