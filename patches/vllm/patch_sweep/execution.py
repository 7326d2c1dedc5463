"""Running a prepared sweep (``run_sweep``): its events, ``start``, a ``cell`` for each cell measured and
the ``summary`` (the non-streamed response).

Two executors. Batched (batched.py): one engine request runs the corrupt prompt alone, then worker
calls rerun the layers from each cell's patch up, a slice of cells at a time. Per request: each cell is
an ordinary vLLM request (``max_tokens=1``, greedy, ``logprob_token_ids=[answer, foil]``), all submitted
at once, so vLLM's scheduler batches the cells with each other and with the two baselines. With prefix
reuse (the default) the corrupt run and the cells share a secret ``cache_salt`` and a cell reads the
blocks before its first patched position; its later blocks hash privately (runtime.private_block_keys),
so a patched KV block is never served to anyone. Without it every request has its own salt and reads
nothing from the prefix cache.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import uuid
from typing import Any, AsyncIterator

from toolkit.patches.vllm.patch_sweep.engine_client import Engine
from toolkit.patches.vllm.patch_sweep.refusals import BadRequest
from toolkit.patches.vllm.patch_sweep.shared import SHARED_PREFIX
from toolkit.patches.vllm.patch_sweep.sweep import Sweep, batched_reason

# A batched worker call's work at most (recomputed layer rows x hidden size, about): the engine loop waits
# for a call, so a long sweep goes in several and other requests step between them.
CALL_ELEMENTS_ENV = "TOOLKIT_PATCH_SWEEP_CALL_ELEMENTS"
DEFAULT_CALL_ELEMENTS = 1 << 24


def _call_elements() -> int:
    try:
        return max(1, int(os.environ.get(CALL_ELEMENTS_ENV, DEFAULT_CALL_ELEMENTS)))
    except ValueError:  # a bad setting keeps the default rather than failing every sweep
        return DEFAULT_CALL_ELEMENTS


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
    state["executor_reason"] = batched_reason(engine, sweep)
    if state["executor_reason"] is None:
        results = _batched_cells(engine, sweep, scored, cells, state)
        first = await anext(results, None)
        if first is None:  # the worker cannot run it batched: the sweep goes the per-request way
            results, state["executor_reason"] = None, engine.batched_unsupported
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
        "executor_reason": state["executor_reason"],
        "batched_calls": state.get("batched_calls"), "prefix_reuse": state["reuse"],
    }


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
                if number == 0:
                    return  # nothing measured yet: the sweep goes by requests
                raise BadRequest(f"the sweep stopped: {answer['unsupported']}; send it again (it runs by requests now)",
                                 status=409)
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
