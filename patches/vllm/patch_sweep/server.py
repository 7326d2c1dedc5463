"""API-server side of patch-sweep: the routes, request validation, and the sweep itself.

Loaded only when patching is enabled (``runtime.attach_routes``). Every cell is an ordinary vLLM
request (``max_tokens=1``, greedy, ``logprob_token_ids=[answer, foil]``) submitted concurrently, so
vLLM's scheduler batches the cells with each other and with the two baselines; the patch travels to
the worker as plain data in ``SamplingParams.extra_args`` (see ``worker.py``). Each sweep request gets
its own ``cache_salt`` and skips reading the prefix cache, so a patched position is always recomputed
and a patched KV block is never served to anyone else.

Routes:
  POST   /v1/patch_runs          capture a prompt's activations under a run name
  GET    /v1/patch_runs          list stored runs (bytes used, bound)
  GET    /v1/patch_runs/{name}   one run, with its prompt token ids
  DELETE /v1/patch_runs/{name}   drop a run
  POST   /v1/patch_sweep         the grid (``stream: true`` for SSE: start, cell..., summary, [DONE])

Every mistake in a request is a 400 whose ``error.message`` says what to change; the server stays up.
"""


import asyncio
import inspect
import itertools
import json
import math
import os
import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from toolkit.patches.common.spans import ALL_PROMPT, SpanError, prompt_char_offsets, resolve_positions
from toolkit.patches.vllm.patch_sweep.shared import PLAN_KEY, SHARED_PREFIX, WORKER_PREFIX

HOOKS = ("pre_attn", "post_attn", "post_block")
METRICS = ("logprob", "logit_diff", "recovered")
MAX_CELLS_ENV = "TOOLKIT_PATCH_SWEEP_MAX_CELLS"
MAX_BYTES_ENV = "TOOLKIT_PATCH_RUNS_MAX_BYTES"
DEFAULT_MAX_CELLS = 4096
DEFAULT_MAX_BYTES = 256 << 20
SWEEP_FIELDS = {"model", "prompt", "source_run", "clean_prompt", "hook", "layers", "positions", "alpha", "answer_token",
                "answer_token_id", "foil_token", "foil_token_id", "metric", "stream", "baselines", "noise",
                "prefix_reuse", "executor"}
EXECUTORS = ("auto", "batched", "requests")
BATCHED_HOOKS = ("pre_attn", "post_block")  # hooks between layers: the batched executor's cells
# A batched worker call's work at most (recomputed layer rows x hidden size, about): the engine loop waits
# for a call, so a long sweep goes in several and other requests step between them.
CALL_ELEMENTS_ENV = "TOOLKIT_PATCH_SWEEP_CALL_ELEMENTS"
DEFAULT_CALL_ELEMENTS = 1 << 24
NOISE_FIELDS = {"positions", "seed", "scale"}
NOISE_STD_FACTOR = 3.0  # ROME's causal tracing: noise 3x the standard deviation of the embeddings
CAPTURE_FIELDS = {"model", "prompt", "name", "layers", "hooks"}
ACTIVATION_HOOKS = HOOKS + ("attn_out", "mlp_out")
ACTIVATION_FIELDS = {"model", "prompt", "messages", "prompt_token_ids", "hooks", "layers", "positions", "encoding"}
ENCODINGS = ("base64", "safetensors")
MAX_ACTIVATION_BYTES_ENV = "TOOLKIT_ACTIVATIONS_MAX_BYTES"
DEFAULT_MAX_ACTIVATION_BYTES = 64 << 20


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _max_cells() -> int:
    return int(os.environ.get(MAX_CELLS_ENV, DEFAULT_MAX_CELLS))


def _call_elements() -> int:
    try:
        return max(1, int(os.environ.get(CALL_ELEMENTS_ENV, DEFAULT_CALL_ELEMENTS)))
    except ValueError:  # a bad setting keeps the default rather than failing every sweep
        return DEFAULT_CALL_ELEMENTS


# --------------------------------------------------------------------------------------------------
# the engine: worker RPCs and one scored request


class Engine:
    """The API server's view of the engine for patch-sweep (one per app)."""

    def __init__(self, client: Any):
        self.client = client
        self.secret = secrets.token_hex(16)
        self._request_prefix = f"patchsweep-{secrets.token_hex(8)}"  # + a counter: unique, cheaper than uuid4
        self._request_count = itertools.count()
        self.num_layers = 0
        self.embedding_std = 0.0
        self.batched_unsupported: str | None = None  # why the worker cannot run sweeps batched (None: it can)
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

    async def score(self, token_ids: list[int], scored: list[int], plan: dict[str, Any] | None = None,
                    sweep_salt: str | None = None) -> tuple[dict[int, float], int]:
        """Run ``token_ids`` as one request (patched/captured by ``plan``); the next-token logprobs of
        ``scored`` and how many prompt tokens came from the prefix cache. Without ``sweep_salt`` the request reads nothing from the prefix cache and its salt
        is its own; with it, the request shares the sweep's secret salt and reads the cache (a cell's
        plan then carries ``shared_prefix``, so only its blocks before that position are shared: see
        runtime.private_block_keys)."""
        from vllm import SamplingParams

        request_id = f"{self._request_prefix}-{next(self._request_count)}"
        extra = {PLAN_KEY: {**plan, "secret": self.secret}} if plan else None
        params = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=list(scored) or None,
                                extra_args=extra, skip_reading_prefix_cache=sweep_salt is None, detokenize=False)
        prompt = {"prompt_token_ids": list(token_ids), "cache_salt": sweep_salt or request_id}
        final = None
        async for output in self.client.generate(prompt, params, request_id):
            final = output
        cached = int(getattr(final, "num_cached_tokens", 0) or 0)
        if not scored:
            return {}, cached
        logprobs = final.outputs[0].logprobs[0]
        return {token: float(logprobs[token].logprob) for token in scored}, cached

    @property
    def hidden_size(self) -> int:
        return int(self.client.model_config.get_hidden_size())

    @property
    def item_size(self) -> int:
        dtype = self.client.model_config.dtype
        return int(getattr(dtype, "itemsize", 4))

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


# --------------------------------------------------------------------------------------------------
# validation


def _check_fields(body: Any, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
    return body


def _string(body: dict, name: str, required: bool = False) -> str | None:
    value = body.get(name)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{name} must be a non-empty string")
    return value


def parse_layers(value: Any, num_layers: int) -> list[int]:
    """A list of layer indices, ``{"start", "stop", "step"}`` (a Python range) or ``"all"``."""
    if value is None or value == "all":
        return list(range(num_layers))
    if isinstance(value, dict):
        unknown = set(value) - {"start", "stop", "step"}
        parts = [value.get("start", 0), value.get("stop", num_layers), value.get("step", 1)]
        if unknown or not all(isinstance(p, int) and not isinstance(p, bool) for p in parts) or parts[2] <= 0:
            raise BadRequest('layers as a range is {"start": int, "stop": int, "step": int > 0}')
        layers = list(range(*parts))
    elif isinstance(value, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        layers = value
    else:
        raise BadRequest('layers must be a list of integers, {"start", "stop", "step"} or "all"')
    if not layers:
        raise BadRequest("layers is empty")
    for layer in layers:
        if not 0 <= layer < num_layers:
            raise BadRequest(f"layer {layer} out of range: the model has {num_layers} layers (0..{num_layers - 1})")
    return list(dict.fromkeys(layers))


def _token(body: dict, name: str, tokenizer: Any, vocab_size: int, required: bool) -> int | None:
    text, token_id = body.get(f"{name}_token"), body.get(f"{name}_token_id")
    if text is not None and token_id is not None:
        raise BadRequest(f"give {name}_token or {name}_token_id, not both")
    if token_id is not None:
        if isinstance(token_id, bool) or not isinstance(token_id, int) or not 0 <= token_id < vocab_size:
            raise BadRequest(f"{name}_token_id must be an integer in 0..{vocab_size - 1}")
        return token_id
    if text is None:
        if required:
            raise BadRequest(f"{name}_token (a string that is one token) or {name}_token_id is required")
        return None
    if not isinstance(text, str) or not text:
        raise BadRequest(f"{name}_token must be a non-empty string")
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise BadRequest(f"{name}_token {text!r} is {len(ids)} tokens {list(ids)}, not one; pick a single-token "
                         f"string (often with its leading space) or send {name}_token_id")
    return int(ids[0])


def _encode(tokenizer: Any, prompt: str, max_model_len: int, name: str = "prompt",
            add_special_tokens: bool = True) -> list[int]:
    ids = [int(i) for i in tokenizer.encode(prompt, add_special_tokens=add_special_tokens)]
    if not ids:
        raise BadRequest(f"{name} encodes to no tokens")
    if len(ids) >= max_model_len:
        raise BadRequest(f"{name} is {len(ids)} tokens; the model's limit is {max_model_len - 1} for a sweep")
    return ids


@dataclass
class Sweep:
    prompt_ids: list[int]
    position_tokens: list[str]
    hook: str
    layers: list[int]
    positions: list[Any]  # a column: an int (one position) or a list of ints (a span cell, patched at once)
    alpha: float
    answer: int
    foil: int | None
    metric: str
    baselines: bool
    source_run: str = ""
    source_ids: list[int] = field(default_factory=list)
    auto_captured: bool = False
    skipped: list[dict[str, Any]] = field(default_factory=list)
    noise: dict[str, Any] | None = None  # {"positions", "seed", "scale"}: the corrupt run is the prompt plus noise
    prefix_reuse: bool = True  # cells read the corrupt run's KV before their first patched position
    executor: str = "auto"  # auto: batched in the worker where it can be, else a request per cell

    def column(self, j: int) -> list[int]:
        """The positions cell column ``j`` patches."""
        value = self.positions[j]
        return list(value) if isinstance(value, list) else [value]

    def label(self, j: int) -> str:
        return "".join(self.position_tokens[p] for p in self.column(j))

    @property
    def base_metric(self) -> str:
        return "logit_diff" if self.foil is not None else "logprob"

    def cells(self) -> list[tuple[int, int]]:
        skipped = {(s["layer"], _key(s["position"])) for s in self.skipped}
        return [(i, j) for i, layer in enumerate(self.layers) for j, position in enumerate(self.positions)
                if (layer, _key(position)) not in skipped]


def _key(column: Any) -> Any:
    return tuple(column) if isinstance(column, list) else column


def resolve_columns(value: Any, offsets: Any) -> list[Any]:
    """The sweep's position axis. ``"all_prompt"`` and integers and spans give one column per token (as
    ``resolve_positions``); a nested list of integers and spans, or a span with ``"whole": true``, gives
    one column patching all its tokens at once (a span cell). Duplicate columns are dropped."""
    if not isinstance(value, list):
        return resolve_positions(value, offsets)
    if not value:
        raise SpanError("positions is empty")
    columns: list[Any] = []
    for item in value:
        if isinstance(item, dict) and "whole" in item:
            if not isinstance(item["whole"], bool):
                raise SpanError(f"whole must be true or false, got {item['whole']!r}")
            group = {k: v for k, v in item.items() if k != "whole"}
            found = resolve_positions([group], offsets)
            new = [found] if item["whole"] else found
        elif isinstance(item, list):
            new = [resolve_positions(item, offsets)]
        else:
            new = resolve_positions([item], offsets)
        columns += [c for c in new if c not in columns]
    return columns


def parse_noise(value: Any, offsets: Any, embedding_std: float) -> dict[str, Any]:
    """``{"positions": [...], "seed": int, "scale": number}``: Gaussian noise on those positions'
    embeddings; ``scale`` defaults to 3x the embeddings' standard deviation (as ROME)."""
    if not isinstance(value, dict):
        raise BadRequest('noise must be {"positions": [...], "seed": int, "scale": number (optional)}')
    unknown = sorted(set(value) - NOISE_FIELDS)
    if unknown:
        raise BadRequest(f"unknown noise field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(NOISE_FIELDS))}")
    if "positions" not in value:
        raise BadRequest("noise.positions is required (the tokens whose embeddings get noise, e.g. [{\"span\": \"Paris\"}])")
    try:
        positions = resolve_positions(value["positions"], offsets)
    except SpanError as exc:
        raise BadRequest(f"noise.positions: {exc}") from None
    seed = value.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
        raise BadRequest("noise.seed must be a non-negative integer")
    scale = value.get("scale")
    if scale is None:
        scale = NOISE_STD_FACTOR * embedding_std
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale < 0:
        raise BadRequest("noise.scale must be a finite number >= 0 (omit it for 3x the embeddings' std)")
    return {"positions": positions, "seed": seed, "scale": float(scale)}


async def prepare_sweep(engine: Engine, body: Any) -> Sweep:
    """Validate a sweep request, resolve spans, and find (or auto-capture) its source run."""
    body = _check_fields(body, SWEEP_FIELDS)
    prompt = _string(body, "prompt", required=True)
    source_run, clean_prompt = _string(body, "source_run"), _string(body, "clean_prompt")
    hook = body.get("hook", "post_block")
    if hook not in HOOKS:
        raise BadRequest(f"hook must be one of {', '.join(HOOKS)}, got {hook!r}")
    tokenizer = await engine.tokenizer()
    foil_given = body.get("foil_token") is not None or body.get("foil_token_id") is not None
    metric = body.get("metric", "logit_diff" if foil_given else "logprob")
    if metric not in METRICS:
        raise BadRequest(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
    answer = _token(body, "answer", tokenizer, engine.vocab_size, required=True)
    foil = _token(body, "foil", tokenizer, engine.vocab_size, required=metric == "logit_diff")
    alpha = body.get("alpha", 1.0)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha):
        raise BadRequest("alpha must be a finite number (1 replaces, other values interpolate)")
    baselines = body.get("baselines", True)
    if not isinstance(baselines, bool):
        raise BadRequest("baselines must be true or false")
    if metric == "recovered" and not baselines:
        raise BadRequest("metric recovered needs the baselines; drop baselines: false")
    prefix_reuse = body.get("prefix_reuse", True)
    if not isinstance(prefix_reuse, bool):
        raise BadRequest("prefix_reuse must be true or false")
    executor = body.get("executor", "auto")
    if executor not in EXECUTORS:
        raise BadRequest(f"executor must be one of {', '.join(EXECUTORS)}, got {executor!r}")
    if not isinstance(body.get("stream", False), bool):
        raise BadRequest("stream must be true or false")
    layers = parse_layers(body.get("layers"), engine.num_layers)
    prompt_ids = _encode(tokenizer, prompt, engine.max_model_len)
    offsets = prompt_char_offsets(tokenizer, prompt, prompt_ids)
    try:
        positions = resolve_columns(body.get("positions", ALL_PROMPT), offsets)
    except SpanError as exc:
        raise BadRequest(str(exc)) from None
    noise = None if body.get("noise") is None else parse_noise(body["noise"], offsets, engine.embedding_std)
    if noise is not None and source_run is None and clean_prompt is None:
        clean_prompt = prompt  # causal tracing: the clean run is the prompt itself, the corrupt run adds noise
    if len(layers) * len(positions) > _max_cells():
        raise BadRequest(f"the grid has {len(layers)} x {len(positions)} = {len(layers) * len(positions)} cells, "
                         f"over this server's limit of {_max_cells()} ({MAX_CELLS_ENV}); sweep fewer layers or positions")
    sweep = Sweep(prompt_ids, [tokenizer.decode([i]) for i in prompt_ids], hook, layers, positions, float(alpha),
                  answer, foil, metric, baselines, noise=noise, prefix_reuse=prefix_reuse, executor=executor)
    if executor == "batched":
        reason = batched_reason(engine, sweep)
        if reason is not None:
            raise BadRequest(f"executor batched cannot run this sweep: {reason}; use executor auto or requests")

    run = await engine.rpc("run", source_run) if source_run else None
    if run is None and clean_prompt is not None:
        name = source_run or f"auto-{uuid.uuid4().hex[:12]}"
        clean_ids = _encode(tokenizer, clean_prompt, engine.max_model_len, "clean_prompt")
        run = await engine.capture(name, clean_prompt, clean_ids, layers, [hook])
        run["prompt_token_ids"] = clean_ids
        sweep.auto_captured = True
    elif run is None:
        raise BadRequest(f"unknown run {source_run!r}: capture it first (POST /v1/patch_runs) or send clean_prompt"
                         if source_run else "source_run or clean_prompt is required")
    sweep.source_run, sweep.source_ids = run["name"], list(run["prompt_token_ids"])
    captured = set(run["captured"].get(hook, []))
    for layer in layers:
        for j, position in enumerate(positions):
            if layer not in captured:
                reason = f"run {run['name']!r} has no {hook} activations at layer {layer}"
            elif max(sweep.column(j)) >= len(sweep.source_ids):
                reason = f"position {max(sweep.column(j))} is past the end of run {run['name']!r} ({len(sweep.source_ids)} tokens)"
            else:
                continue
            sweep.skipped.append({"layer": layer, "position": position, "reason": reason})
    return sweep


# --------------------------------------------------------------------------------------------------
# activation capture: POST /v1/activations


@dataclass
class ActivationRequest:
    token_ids: list[int]
    hooks: list[str]
    layers: list[int]
    positions: list[int]
    encoding: str
    position_tokens: list[str]


async def prepare_activations(engine: Engine, body: Any) -> ActivationRequest:
    body = _check_fields(body, ACTIVATION_FIELDS)
    given = [name for name in ("prompt", "messages", "prompt_token_ids") if body.get(name) is not None]
    if len(given) != 1:
        raise BadRequest("give exactly one of prompt (text), messages (chat) or prompt_token_ids")
    tokenizer = await engine.tokenizer()
    text = None
    if given[0] == "prompt":
        text = _string(body, "prompt", required=True)
        ids = _encode(tokenizer, text, engine.max_model_len)
    elif given[0] == "messages":
        text = _chat_text(tokenizer, body["messages"])
        ids = _encode(tokenizer, text, engine.max_model_len, "messages", add_special_tokens=False)
    else:
        ids = body["prompt_token_ids"]
        if (not isinstance(ids, list) or not ids
                or not all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < engine.vocab_size for i in ids)):
            raise BadRequest(f"prompt_token_ids must be a non-empty list of token ids in 0..{engine.vocab_size - 1}")
        if len(ids) >= engine.max_model_len:
            raise BadRequest(f"prompt_token_ids is {len(ids)} tokens; the model's limit is {engine.max_model_len - 1}")
    hooks = body.get("hooks", ["post_block"])
    if not isinstance(hooks, list) or not hooks or any(h not in ACTIVATION_HOOKS for h in hooks):
        raise BadRequest(f"hooks must be a non-empty list drawn from {', '.join(ACTIVATION_HOOKS)}")
    layers = parse_layers(body.get("layers"), engine.num_layers)
    encoding = body.get("encoding", "base64")
    if encoding not in ENCODINGS:
        raise BadRequest(f"encoding must be one of {', '.join(ENCODINGS)}, got {encoding!r}")
    positions_value = body.get("positions", ALL_PROMPT)
    try:
        if text is not None:
            positions = resolve_positions(positions_value, prompt_char_offsets(tokenizer, text, ids))
        elif positions_value == ALL_PROMPT or (isinstance(positions_value, list) and all(
                isinstance(p, int) and not isinstance(p, bool) for p in positions_value)):
            positions = resolve_positions(positions_value, _no_text(len(ids)))
        else:
            raise BadRequest("with prompt_token_ids, positions are integers (spans need a text prompt)")
    except SpanError as exc:
        raise BadRequest(str(exc)) from None
    hooks = list(dict.fromkeys(hooks))
    size = len(positions) * len(layers) * len(hooks) * engine.hidden_size * engine.item_size
    bound = int(os.environ.get(MAX_ACTIVATION_BYTES_ENV, DEFAULT_MAX_ACTIVATION_BYTES))
    if size > bound:
        raise BadRequest(f"the activations would take {size} bytes ({len(layers)} layers x {len(hooks)} hooks x "
                         f"{len(positions)} positions x {engine.hidden_size} x {engine.item_size} bytes), over this "
                         f"server's bound of {bound} ({MAX_ACTIVATION_BYTES_ENV}); ask for fewer layers, hooks or positions")
    return ActivationRequest(list(map(int, ids)), hooks, layers, positions, encoding,
                             [tokenizer.decode([i]) for i in ids])


def _no_text(count: int) -> Any:
    from toolkit.patches.common.spans import TokenOffsets

    return TokenOffsets("", tuple((0, 0) for _ in range(count)), "token_ids")


def _chat_text(tokenizer: Any, messages: Any) -> str:
    if (not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages)):
        raise BadRequest('messages must be a non-empty list of {"role": str, "content": str}')
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    except Exception as exc:  # no template, or one that refuses these messages
        raise BadRequest(f"the model's chat template cannot render these messages: {exc}") from None


async def run_activations(engine: Engine, request: ActivationRequest) -> tuple[dict[str, Any], dict[str, dict]]:
    """The response's JSON part and the arrays ("hook.layer" -> dtype, shape, data), in request order."""
    taken = await engine.activations(request.token_ids, request.layers, request.hooks, request.positions)
    arrays = {}
    for hook in request.hooks:
        for layer in request.layers:
            name = f"{hook}.{layer}"
            if name not in taken:
                raise BadRequest(f"the model recorded no {hook} activations at layer {layer}", status=500)
            arrays[name] = taken[name]
    info = {"object": "activations", "prompt_token_ids": request.token_ids, "positions": request.positions,
            "position_tokens": [request.position_tokens[p] for p in request.positions], "hooks": request.hooks,
            "layers": request.layers, "bytes": sum(len(a["data"]) for a in arrays.values())}
    return info, arrays


# --------------------------------------------------------------------------------------------------
# running a sweep: events (start, cell..., summary); the summary is the non-streamed response


def _measures(logprobs: dict[int, float], sweep: Sweep) -> dict[str, float]:
    out = {"logprob": logprobs[sweep.answer]}
    if sweep.foil is not None:
        out["logit_diff"] = logprobs[sweep.answer] - logprobs[sweep.foil]
    return out


def _value(measures: dict[str, float], sweep: Sweep, clean: dict | None, corrupt: dict | None) -> float | None:
    if sweep.metric != "recovered":
        return measures[sweep.metric]
    key = sweep.base_metric
    gap = clean[key] - corrupt[key]  # type: ignore[index]
    return None if gap == 0 else (measures[key] - corrupt[key]) / gap  # type: ignore[index]


async def run_sweep(engine: Engine, sweep: Sweep) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    scored = [sweep.answer] + ([sweep.foil] if sweep.foil is not None else [])
    cells = sweep.cells()
    yield "start", {"source_run": sweep.source_run, "auto_captured": sweep.auto_captured, "hook": sweep.hook,
                    "metric": sweep.metric, "layers": sweep.layers, "positions": sweep.positions,
                    "num_cells": len(cells), "skipped": sweep.skipped}
    state: dict[str, Any] = {"alone": None, "executor": "requests",
                             "reuse": {"enabled": sweep.prefix_reuse, "cell_prompt_tokens": len(cells) * len(sweep.prompt_ids),
                                       "cached_tokens": 0}}
    results = None
    if batched_reason(engine, sweep) is None:
        results = _batched_cells(engine, sweep, scored, cells, state)
        first = await anext(results, None)
        if first is None:  # the worker cannot run it batched: the sweep goes the per-request way
            results = None
        else:
            results = _prepend(first, results)
    if results is None:
        results = _request_cells(engine, sweep, scored, cells, state)

    grid: list[list[float | None]] = [[None] * len(sweep.positions) for _ in sweep.layers]
    base: dict[str, dict[str, float]] = {}
    waiting: list[tuple[tuple[int, int], dict[str, float]]] = []
    async for tag, measures in results:
        if isinstance(tag, str):
            base[tag] = measures
        else:
            waiting.append((tag, measures))
        if sweep.baselines and len(base) < 2:
            continue
        for (i, j), cell in waiting:
            value = _value(cell, sweep, base.get("clean"), base.get("corrupt"))
            grid[i][j] = value
            yield "cell", {"layer": sweep.layers[i], "position": sweep.positions[j], "layer_index": i,
                           "position_index": j, "value": value, **cell}
        waiting = []
    best = None
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            if value is not None and (best is None or value > best["value"]):
                best = {"layer": sweep.layers[i], "position": sweep.positions[j], "value": value}
    noise = None
    alone = state["alone"]
    if alone is not None:
        key = sweep.base_metric
        noise = {"metric": key, "corrupt_alone": alone[key], "corrupt_in_batch": base["corrupt"][key],
                 "abs_diff": abs(alone[key] - base["corrupt"][key])}
    yield "summary", {
        "object": "patch_sweep", "hook": sweep.hook, "metric": sweep.metric, "alpha": sweep.alpha,
        "layers": sweep.layers, "positions": sweep.positions,
        "position_tokens": [sweep.label(j) for j in range(len(sweep.positions))], "grid": grid, "noise": sweep.noise,
        "baselines": {"clean": base["clean"], "corrupt": base["corrupt"]} if sweep.baselines else None,
        "argmax": best, "skipped": sweep.skipped, "noise_floor": noise,
        "source_run": sweep.source_run, "captured_source_run": sweep.source_run if sweep.auto_captured else None,
        "auto_captured": sweep.auto_captured, "answer_token_id": sweep.answer, "foil_token_id": sweep.foil,
        "prompt_token_ids": sweep.prompt_ids, "num_cells": len(cells), "executor": state["executor"],
        "batched_calls": state.get("batched_calls"), "prefix_reuse": state["reuse"],
    }


def batched_reason(engine: Engine, sweep: Sweep) -> str | None:
    """Why this sweep cannot run batched in the worker (None: it can). ``executor: "requests"`` or
    ``prefix_reuse: false`` ask for one engine request per cell."""
    if sweep.executor == "requests" or not sweep.prefix_reuse:
        return "executor requests" if sweep.executor == "requests" else "prefix_reuse false: every cell a full prefill"
    if sweep.hook not in BATCHED_HOOKS:
        return f"hook {sweep.hook} is patched inside a layer: its cells run as requests (batched: {', '.join(BATCHED_HOOKS)})"
    return engine.batched_unsupported


async def _prepend(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item


async def _batched_cells(engine: Engine, sweep: Sweep, scored: list[int], cells: list[tuple[int, int]],
                         state: dict[str, Any]) -> AsyncIterator[tuple[Any, dict[str, float]]]:
    """Every cell in one worker call (batched.py). One engine request runs the corrupt prompt alone and
    captures its input to layer 0 (noise included); the worker reruns the layers from each patch up, over
    the positions from its first patched one. Yields nothing when the worker answers that it cannot."""
    noised = {"noise": sweep.noise} if sweep.noise else {}
    key = uuid.uuid4().hex
    plan = {"capture": key, "layers": [0], "hooks": ["pre_attn"], "n": len(sweep.prompt_ids), **noised}
    try:
        alone, _ = await engine.score(sweep.prompt_ids, scored, plan)
    except BaseException:
        await engine.rpc("discard", key)
        raise
    clean = asyncio.ensure_future(engine.score(sweep.source_ids, scored)) if sweep.baselines else None
    slices = _call_slices(engine, sweep, cells)
    try:
        recomputed = 0
        for number, part in enumerate(slices):
            spec = [(sweep.layers[i], sweep.column(j)) for i, j in part]
            answer = await engine.rpc("batched_sweep", key, sweep.source_run, sweep.hook, spec, scored, sweep.alpha,
                                      number + 1 < len(slices))
            if "unsupported" in answer:
                engine.batched_unsupported = answer["unsupported"]
                return
            if "error" in answer:
                raise BadRequest(f"the sweep could not run: {answer['error']}; send it again", status=409)
            recomputed += int(answer["recomputed_rows"])
            if number == 0:
                state["executor"] = "batched"
                state["alone"] = _measures(alone, sweep) if sweep.baselines else None
                corrupt = _measures(dict(zip(scored, answer["corrupt"])), sweep)
                if clean is not None:
                    yield "clean", _measures((await clean)[0], sweep)
                yield "corrupt", corrupt
            for (i, j), logprobs in zip(part, answer["cells"]):
                yield (i, j), _measures(dict(zip(scored, logprobs)), sweep)
        n = len(sweep.prompt_ids)
        state["batched_calls"] = len(slices)
        state["reuse"].update(cached_tokens=sum(min(sweep.column(j)) for _, j in cells),
                              recomputed_layer_tokens=recomputed, cell_layer_tokens=len(cells) * n * engine.num_layers)
    finally:
        if clean is not None and not clean.done():
            clean.cancel()
        if len(slices) > 1:
            await engine.rpc("discard", key)


def _call_slices(engine: Engine, sweep: Sweep, cells: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    """The cells in consecutive worker calls of at most about ``TOOLKIT_PATCH_SWEEP_CALL_ELEMENTS`` recomputed (layer
    row x hidden) elements each. A worker call holds the engine loop for its duration: between calls the
    engine steps, so other requests on the server go on during a long sweep, and cells stream as each call
    returns. A call also reruns the corrupt prompt (n rows a layer), so a call's budget is at least four
    times that."""
    n, layers = len(sweep.prompt_ids), engine.num_layers
    budget = max(_call_elements() // max(engine.hidden_size, 1), 4 * n * layers)
    offset = 0 if sweep.hook == "pre_attn" else 1
    slices: list[list[tuple[int, int]]] = [[]]
    used = 0
    for i, j in sorted(cells, key=lambda cell: (sweep.layers[cell[0]], cell[1])):
        first, positions = sweep.layers[i] + offset, sweep.column(j)
        if first >= layers:
            rows = 0
        elif first == layers - 1:
            rows = len(set(positions) | {n - 1})
        else:
            rows = (layers - first) * (n - min(positions))
        if slices[-1] and used + rows > budget:
            slices.append([])
            used = 0
        slices[-1].append((i, j))
        used += rows
    return slices


async def _request_cells(engine: Engine, sweep: Sweep, scored: list[int], cells: list[tuple[int, int]],
                         state: dict[str, Any]) -> AsyncIterator[tuple[Any, dict[str, float]]]:
    """Every cell an engine request (max_tokens=1), all submitted at once: vLLM's scheduler batches them."""
    noised = {"noise": sweep.noise} if sweep.noise else None  # the corrupt run's plan: noise, no patch
    # Prefix reuse: the corrupt run alone goes first under the sweep's secret salt, filling the prefix
    # cache with its blocks; each cell (same salt) then reads the blocks before its first patched position
    # and recomputes only from there (its later blocks hash privately: never served to anyone).
    salt = f"patchsweep-{secrets.token_hex(16)}" if sweep.prefix_reuse else None
    if sweep.baselines:
        state["alone"] = _measures((await engine.score(sweep.prompt_ids, scored, noised, sweep_salt=salt))[0], sweep)
    reuse = state["reuse"]

    async def tagged(tag: Any, ids: list[int], plan: dict | None, sweep_salt: str | None = None):
        logprobs, cached = await engine.score(ids, scored, plan, sweep_salt)
        if not isinstance(tag, str):
            reuse["cached_tokens"] += cached
        return tag, _measures(logprobs, sweep)

    jobs = []
    if sweep.baselines:
        jobs += [tagged("clean", sweep.source_ids, None), tagged("corrupt", sweep.prompt_ids, noised)]
    for i, j in cells:
        plan = {"run": sweep.source_run, "layer": sweep.layers[i], "hook": sweep.hook, "positions": sweep.column(j),
                "alpha": sweep.alpha, SHARED_PREFIX: min(sweep.column(j)), **(noised or {})}
        jobs.append(tagged((i, j), sweep.prompt_ids, plan, salt))
    tasks = [asyncio.ensure_future(job) for job in jobs]
    try:
        for next_done in asyncio.as_completed(tasks):
            yield await next_done
    finally:
        for task in tasks:
            task.cancel()


# --------------------------------------------------------------------------------------------------
# routes


def _error(message: str, status: int = 400):
    from fastapi.responses import JSONResponse

    kind = "NotFoundError" if status == 404 else "BadRequestError"
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status_code=status)


async def _body(raw: Any) -> Any:
    try:
        return await raw.json()
    except Exception:
        raise BadRequest("the request body is not valid JSON") from None


def engine_of(app: Any) -> Engine:
    """The app's Engine (one per app, made on first use: the engine client exists only once serving)."""
    state = app.state
    if getattr(state, "toolkit_patch_sweep", None) is None:
        state.toolkit_patch_sweep = Engine(state.engine_client)
    return state.toolkit_patch_sweep


def attach(app: Any) -> None:
    from fastapi import APIRouter, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    router = APIRouter()

    async def guarded(raw: Request, handler):
        try:
            engine = engine_of(raw.app)
            await engine.ensure_installed()
            return await handler(engine)
        except BadRequest as exc:
            return _error(str(exc), exc.status)

    @router.post("/v1/patch_runs")
    async def capture_run(raw: Request):
        async def handler(engine: Engine):
            body = _check_fields(await _body(raw), CAPTURE_FIELDS)
            prompt = _string(body, "prompt", required=True)
            name = _string(body, "name") or f"run-{uuid.uuid4().hex[:12]}"
            hooks = body.get("hooks") or list(HOOKS)
            if not isinstance(hooks, list) or any(h not in HOOKS for h in hooks):
                raise BadRequest(f"hooks must be a list drawn from {', '.join(HOOKS)}")
            layers = parse_layers(body.get("layers"), engine.num_layers)
            ids = _encode(await engine.tokenizer(), prompt, engine.max_model_len)
            info = await engine.capture(name, prompt, ids, layers, list(dict.fromkeys(hooks)))
            return JSONResponse({**info, "prompt_token_ids": ids})

        return await guarded(raw, handler)

    @router.get("/v1/patch_runs")
    async def list_runs(raw: Request):
        async def handler(engine: Engine):
            return JSONResponse(await engine.rpc("runs"))

        return await guarded(raw, handler)

    @router.get("/v1/patch_runs/{name}")
    async def get_run(name: str, raw: Request):
        async def handler(engine: Engine):
            info = await engine.rpc("run", name)
            return _error(f"unknown run {name!r}", 404) if info is None else JSONResponse(info)

        return await guarded(raw, handler)

    @router.delete("/v1/patch_runs/{name}")
    async def delete_run(name: str, raw: Request):
        async def handler(engine: Engine):
            if not await engine.rpc("delete", name):
                return _error(f"unknown run {name!r}", 404)
            return JSONResponse({"deleted": name})

        return await guarded(raw, handler)

    @router.post("/v1/patch_sweep")
    async def patch_sweep(raw: Request):
        async def handler(engine: Engine):
            body = await _body(raw)
            sweep = await prepare_sweep(engine, body)
            if not body.get("stream"):
                summary: dict[str, Any] = {}
                async for kind, data in run_sweep(engine, sweep):
                    summary = data if kind == "summary" else summary
                return JSONResponse(summary)

            async def sse():
                async for kind, data in run_sweep(engine, sweep):
                    yield f"event: {kind}\ndata: {json.dumps(data)}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(sse(), media_type="text/event-stream")

        return await guarded(raw, handler)

    @router.post("/v1/activations")
    async def activations(raw: Request):
        async def handler(engine: Engine):
            import base64

            from fastapi.responses import Response

            from toolkit.patches.vllm.patch_sweep.arrays import encode_safetensors

            request = await prepare_activations(engine, await _body(raw))
            info, arrays = await run_activations(engine, request)
            if request.encoding == "safetensors":
                metadata = {key: json.dumps(value) for key, value in info.items() if key != "object"}
                return Response(encode_safetensors(arrays, metadata), media_type="application/octet-stream")
            info["activations"] = [{"hook": name.split(".")[0], "layer": int(name.split(".")[1]),
                                    "dtype": array["dtype"], "shape": array["shape"],
                                    "data": base64.b64encode(array["data"]).decode()} for name, array in arrays.items()]
            return JSONResponse(info)

        return await guarded(raw, handler)

    app.include_router(router)
