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
import json
import math
import os
import secrets
import uuid
from dataclasses import dataclass, field
from typing import Any, AsyncIterator

from toolkit.patches.common.spans import ALL_PROMPT, SpanError, prompt_char_offsets, resolve_positions
from toolkit.patches.vllm.patch_sweep.shared import WORKER_PREFIX

HOOKS = ("pre_attn", "post_attn", "post_block")
METRICS = ("logprob", "logit_diff", "recovered")
PLAN_KEY = "toolkit_patch_sweep"
MAX_CELLS_ENV = "TOOLKIT_PATCH_SWEEP_MAX_CELLS"
MAX_BYTES_ENV = "TOOLKIT_PATCH_RUNS_MAX_BYTES"
DEFAULT_MAX_CELLS = 4096
DEFAULT_MAX_BYTES = 256 << 20
SWEEP_FIELDS = {"model", "prompt", "source_run", "clean_prompt", "hook", "layers", "positions", "alpha", "answer_token",
                "answer_token_id", "foil_token", "foil_token_id", "metric", "stream", "baselines"}
CAPTURE_FIELDS = {"model", "prompt", "name", "layers", "hooks"}


class BadRequest(Exception):
    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def _max_cells() -> int:
    return int(os.environ.get(MAX_CELLS_ENV, DEFAULT_MAX_CELLS))


# --------------------------------------------------------------------------------------------------
# the engine: worker RPCs and one scored request


class Engine:
    """The API server's view of the engine for patch-sweep (one per app)."""

    def __init__(self, client: Any):
        self.client = client
        self.secret = secrets.token_hex(16)
        self.num_layers = 0
        self._installed = False
        self._lock = asyncio.Lock()

    async def rpc(self, op: str, *args: Any) -> Any:
        results = await self.client.collective_rpc(WORKER_PREFIX + op, args=args)
        return results[0] if isinstance(results, list) else results

    async def ensure_installed(self) -> None:
        async with self._lock:
            if not self._installed:
                info = await self.rpc("install", self.secret, int(os.environ.get(MAX_BYTES_ENV, DEFAULT_MAX_BYTES)))
                self.num_layers = int(info["num_layers"])
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

    async def score(self, token_ids: list[int], scored: list[int], plan: dict[str, Any] | None = None) -> dict[int, float]:
        """Run ``token_ids`` as one request (patched/captured by ``plan``); the next-token logprobs of
        ``scored``."""
        from vllm import SamplingParams

        request_id = f"patchsweep-{uuid.uuid4().hex}"
        extra = {PLAN_KEY: {**plan, "secret": self.secret}} if plan else None
        params = SamplingParams(max_tokens=1, temperature=0.0, logprob_token_ids=list(scored) or None,
                                extra_args=extra, skip_reading_prefix_cache=True)
        prompt = {"prompt_token_ids": list(token_ids), "cache_salt": request_id}
        final = None
        async for output in self.client.generate(prompt, params, request_id):
            final = output
        if not scored:
            return {}
        logprobs = final.outputs[0].logprobs[0]
        return {token: float(logprobs[token].logprob) for token in scored}

    async def capture(self, name: str, prompt: str, token_ids: list[int], layers: list[int], hooks: list[str]) -> dict:
        key = uuid.uuid4().hex
        plan = {"capture": key, "layers": layers, "hooks": hooks, "n": len(token_ids)}
        try:
            await self.score(token_ids, [], plan)
        except BaseException:
            await self.rpc("discard", key)
            raise
        info = await self.rpc("commit", key, name, prompt, token_ids)
        if "error" in info:
            raise BadRequest(info["error"])
        return info


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


def _encode(tokenizer: Any, prompt: str, max_model_len: int, name: str = "prompt") -> list[int]:
    ids = [int(i) for i in tokenizer.encode(prompt, add_special_tokens=True)]
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
    positions: list[int]
    alpha: float
    answer: int
    foil: int | None
    metric: str
    baselines: bool
    source_run: str = ""
    source_ids: list[int] = field(default_factory=list)
    auto_captured: bool = False
    skipped: list[dict[str, Any]] = field(default_factory=list)

    @property
    def base_metric(self) -> str:
        return "logit_diff" if self.foil is not None else "logprob"

    def cells(self) -> list[tuple[int, int]]:
        skipped = {(s["layer"], s["position"]) for s in self.skipped}
        return [(i, j) for i, layer in enumerate(self.layers) for j, position in enumerate(self.positions)
                if (layer, position) not in skipped]


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
    if not isinstance(body.get("stream", False), bool):
        raise BadRequest("stream must be true or false")
    layers = parse_layers(body.get("layers"), engine.num_layers)
    prompt_ids = _encode(tokenizer, prompt, engine.max_model_len)
    try:
        positions = resolve_positions(body.get("positions", ALL_PROMPT),
                                      prompt_char_offsets(tokenizer, prompt, prompt_ids))
    except SpanError as exc:
        raise BadRequest(str(exc)) from None
    if len(layers) * len(positions) > _max_cells():
        raise BadRequest(f"the grid has {len(layers)} x {len(positions)} = {len(layers) * len(positions)} cells, "
                         f"over this server's limit of {_max_cells()} ({MAX_CELLS_ENV}); sweep fewer layers or positions")
    sweep = Sweep(prompt_ids, [tokenizer.decode([i]) for i in prompt_ids], hook, layers, positions, float(alpha),
                  answer, foil, metric, baselines)

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
        for position in positions:
            if layer not in captured:
                reason = f"run {run['name']!r} has no {hook} activations at layer {layer}"
            elif position >= len(sweep.source_ids):
                reason = f"position {position} is past the end of run {run['name']!r} ({len(sweep.source_ids)} tokens)"
            else:
                continue
            sweep.skipped.append({"layer": layer, "position": position, "reason": reason})
    return sweep


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
    alone = _measures(await engine.score(sweep.prompt_ids, scored), sweep) if sweep.baselines else None
    cells = sweep.cells()
    yield "start", {"source_run": sweep.source_run, "auto_captured": sweep.auto_captured, "hook": sweep.hook,
                    "metric": sweep.metric, "layers": sweep.layers, "positions": sweep.positions,
                    "num_cells": len(cells), "skipped": sweep.skipped}

    async def tagged(tag: Any, ids: list[int], plan: dict | None):
        return tag, _measures(await engine.score(ids, scored, plan), sweep)

    jobs = []
    if sweep.baselines:
        jobs += [tagged("clean", sweep.source_ids, None), tagged("corrupt", sweep.prompt_ids, None)]
    for i, j in cells:
        plan = {"run": sweep.source_run, "layer": sweep.layers[i], "hook": sweep.hook,
                "positions": [sweep.positions[j]], "alpha": sweep.alpha}
        jobs.append(tagged((i, j), sweep.prompt_ids, plan))
    tasks = [asyncio.ensure_future(job) for job in jobs]
    grid: list[list[float | None]] = [[None] * len(sweep.positions) for _ in sweep.layers]
    base: dict[str, dict[str, float]] = {}
    waiting: list[tuple[tuple[int, int], dict[str, float]]] = []
    try:
        for next_done in asyncio.as_completed(tasks):
            tag, measures = await next_done
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
    finally:
        for task in tasks:
            task.cancel()
    best = None
    for i, row in enumerate(grid):
        for j, value in enumerate(row):
            if value is not None and (best is None or value > best["value"]):
                best = {"layer": sweep.layers[i], "position": sweep.positions[j], "value": value}
    noise = None
    if alone is not None:
        key = sweep.base_metric
        noise = {"metric": key, "corrupt_alone": alone[key], "corrupt_in_batch": base["corrupt"][key],
                 "abs_diff": abs(alone[key] - base["corrupt"][key])}
    yield "summary", {
        "object": "patch_sweep", "hook": sweep.hook, "metric": sweep.metric, "alpha": sweep.alpha,
        "layers": sweep.layers, "positions": sweep.positions,
        "position_tokens": [sweep.position_tokens[p] for p in sweep.positions], "grid": grid,
        "baselines": {"clean": base["clean"], "corrupt": base["corrupt"]} if sweep.baselines else None,
        "argmax": best, "skipped": sweep.skipped, "noise_floor": noise,
        "source_run": sweep.source_run, "captured_source_run": sweep.source_run if sweep.auto_captured else None,
        "auto_captured": sweep.auto_captured, "answer_token_id": sweep.answer, "foil_token_id": sweep.foil,
        "prompt_token_ids": sweep.prompt_ids, "num_cells": len(cells),
    }


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


def attach(app: Any) -> None:
    from fastapi import APIRouter, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    router = APIRouter()

    def engine_of(raw: Request) -> Engine:
        state = raw.app.state
        if getattr(state, "toolkit_patch_sweep", None) is None:
            state.toolkit_patch_sweep = Engine(state.engine_client)
        return state.toolkit_patch_sweep

    async def guarded(raw: Request, handler):
        try:
            engine = engine_of(raw)
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

    app.include_router(router)
