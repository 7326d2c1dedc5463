"""A sweep request made concrete (``prepare_sweep``): its body checked (bodies.py), then its tokens,
layers, position columns and noise resolved against the served model, and its source run found in the
workers' store or captured from ``clean_prompt``. The result, a ``Sweep``, is what execution.py runs."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from typing import Any

from toolkit.patches.common.spans import SpanError, prompt_char_offsets, resolve_positions
from toolkit.patches.vllm.patch_sweep.bodies import NoiseBody, SweepBody, encode_prompt, parse_body, parse_layers
from toolkit.patches.vllm.patch_sweep.engine_client import Engine
from toolkit.patches.vllm.patch_sweep.refusals import BadRequest

MAX_CELLS_ENV = "TOOLKIT_PATCH_SWEEP_MAX_CELLS"
DEFAULT_MAX_CELLS = 4096
BATCHED_HOOKS = ("pre_attn", "post_block")  # hooks between layers: the batched executor's cells
NOISE_STD_FACTOR = 3.0  # ROME's causal tracing: noise 3x the standard deviation of the embeddings


def _max_cells() -> int:
    return int(os.environ.get(MAX_CELLS_ENV, DEFAULT_MAX_CELLS))


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


def batched_reason(engine: Engine, sweep: Sweep) -> str | None:
    """Why this sweep cannot run batched in the worker (None: it can). ``executor: "requests"`` or
    ``prefix_reuse: false`` ask for one engine request per cell."""
    if sweep.executor == "requests" or not sweep.prefix_reuse:
        return "executor requests" if sweep.executor == "requests" else "prefix_reuse false: every cell a full prefill"
    if sweep.hook not in BATCHED_HOOKS:
        return f"hook {sweep.hook} is patched inside a layer: its cells run as requests (batched: {', '.join(BATCHED_HOOKS)})"
    return engine.batched_unsupported


def _token_id(request: SweepBody, name: str, tokenizer: Any) -> int | None:
    """The ``answer`` or ``foil`` token's id: as sent, or the one token its text encodes to."""
    text, token_id = getattr(request, f"{name}_token"), getattr(request, f"{name}_token_id")
    if text is None:
        return token_id
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) != 1:
        raise BadRequest(f"{name}_token {text!r} is {len(ids)} tokens {list(ids)}, not one; pick a single-token "
                         f"string (often with its leading space) or send {name}_token_id")
    return int(ids[0])


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


def resolve_noise(noise: NoiseBody, offsets: Any, embedding_std: float) -> dict[str, Any]:
    """Gaussian noise on the embeddings of ``noise.positions``; ``scale`` defaults to 3x the embeddings'
    standard deviation (as ROME)."""
    try:
        positions = resolve_positions(noise.positions, offsets)
    except SpanError as exc:
        raise BadRequest(f"noise.positions: {exc}") from None
    scale = NOISE_STD_FACTOR * embedding_std if noise.scale is None else noise.scale
    return {"positions": positions, "seed": noise.seed, "scale": float(scale)}


async def prepare_sweep(engine: Engine, body: Any) -> Sweep:
    """Validate a sweep request, resolve spans, and find (or auto-capture) its source run."""
    request = parse_body(SweepBody, body, last_token_id=engine.vocab_size - 1)
    tokenizer = await engine.tokenizer()
    answer, foil = _token_id(request, "answer", tokenizer), _token_id(request, "foil", tokenizer)
    if answer is None:  # SweepBody._fields_agree refuses a body without one; here for the type
        raise BadRequest("answer_token (a string that is one token) or answer_token_id is required")
    layers = parse_layers(request.layers, engine.num_layers)
    prompt_ids = encode_prompt(tokenizer, request.prompt, engine.max_model_len)
    offsets = prompt_char_offsets(tokenizer, request.prompt, prompt_ids)
    try:
        positions = resolve_columns(request.positions, offsets)
    except SpanError as exc:
        raise BadRequest(str(exc)) from None
    noise = None if request.noise is None else resolve_noise(request.noise, offsets, engine.embedding_std)
    source_run, clean_prompt, hook = request.source_run, request.clean_prompt, request.hook
    if noise is not None and source_run is None and clean_prompt is None:
        clean_prompt = request.prompt  # causal tracing: the clean run is the prompt itself, the corrupt run adds noise
    if len(layers) * len(positions) > _max_cells():
        raise BadRequest(f"the grid has {len(layers)} x {len(positions)} = {len(layers) * len(positions)} cells, "
                         f"over this server's limit of {_max_cells()} ({MAX_CELLS_ENV}); sweep fewer layers or positions")
    sweep = Sweep(prompt_ids, [tokenizer.decode([i]) for i in prompt_ids], hook, layers, positions, request.alpha,
                  answer, foil, request.metric, request.baselines, noise=noise, prefix_reuse=request.prefix_reuse,
                  executor=request.executor)
    if request.executor == "batched":
        reason = batched_reason(engine, sweep)
        if reason is not None:
            raise BadRequest(f"executor batched cannot run this sweep: {reason}; use executor auto or requests")

    run = await engine.rpc("run", source_run) if source_run else None
    if run is None and clean_prompt is not None:
        name = source_run or f"auto-{uuid.uuid4().hex[:12]}"
        clean_ids = encode_prompt(tokenizer, clean_prompt, engine.max_model_len, "clean_prompt")
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
