"""Worker side of patch-sweep: forward hooks on the decoder layers that capture and patch the stream.

The API server sends each sweep cell as an ordinary request whose ``SamplingParams.extra_args`` carry
a plan under ``"toolkit_patch_sweep"`` (plain data, never code), stamped with a secret the API server
gave this worker at install time, so a plan smuggled in through a client's ``vllm_xargs`` is ignored:

* ``{"capture": key, "layers": [...], "hooks": [...], "n": tokens}``: record the residual stream of
  every prompt position at those layers and hook points (committed as a named run by ``commit``);
* ``{"run": name, "layer": L, "hook": h, "positions": [...], "alpha": a}``: at layer ``L``, hook ``h``,
  replace the stream at those positions by ``(1 - a) * own + a * run's`` (``a == 1``: the run's).

Hook points, in the names of the residual stream (vLLM defers the residual add, so each is rebuilt):

* ``pre_attn``: the layer's input, ``hidden + residual`` (layer 0: ``hidden``);
* ``post_attn``: after attention, ``attn_out + residual`` (the input of ``post_attention_layernorm``);
* ``post_block``: the layer's output, ``hidden + residual``.

A patched row is written as ``hidden = value, residual = 0``, so the next fused add gives exactly
``value``; rows of other requests in the batch are never touched. Rows map to requests through the
model runner's ``input_batch.req_ids`` and ``query_start_loc`` and the absolute ``positions`` fed to
the layer (chunked prefill works). Captures and stored runs live in this process (store.py).
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from toolkit.patches.vllm.patch_sweep import store
from toolkit.patches.vllm.patch_sweep.batched import failure, probed_executor
from toolkit.patches.vllm.patch_sweep.shared import PLAN_KEY, STEER_KEY, log
from toolkit.patches.vllm.patch_sweep.store import STORE

HOOKS = ("pre_attn", "post_attn", "post_block")  # points of the residual stream: captured and patched
PARTS = ("attn_out", "mlp_out")  # the attention and MLP outputs (what each adds to the stream): captured only


@dataclass
class _Active:
    """One planned request in the current forward pass: its rows and the absolute position of the first."""

    plan: dict[str, Any]
    begin: int
    end: int
    start: int
    patch: tuple[torch.Tensor, torch.Tensor] | None = None  # (rows, source values) for a patch plan


@dataclass
class _State:
    secret: str | None = None
    runner: Any = None
    first_layer: Any = None
    handles: list[Any] = field(default_factory=list)
    num_layers: int = 0
    embedding_moments: tuple[float, float, float] = (0.0, 0.0, 0.0)
    step: list[_Active] = field(default_factory=list)
    executor: Any = None  # batched.Executor, built and probed at install
    bypass: bool = False  # the batched sweep drives the layers itself: the hooks stand aside


STATE = _State()


# --------------------------------------------------------------------------------------------------
# rows of the current forward pass


def _begin_step(positions: torch.Tensor, num_rows: int) -> None:
    STATE.step = []
    runner = STATE.runner
    batch = getattr(runner, "input_batch", None)
    if batch is None or positions.dim() != 1:
        return
    count = batch.num_reqs
    starts = runner.query_start_loc.np[: count + 1]
    if count == 0 or int(starts[count]) > num_rows:  # a dummy or profiling run: nothing of ours
        return
    for index, req_id in enumerate(batch.req_ids[:count]):
        request = runner.requests.get(req_id)
        params = getattr(request, "sampling_params", None)
        extra = getattr(params, "extra_args", None) or {}
        plan = extra.get(PLAN_KEY)
        if STEER_KEY in extra and isinstance(extra[STEER_KEY], str):
            plan = _steering_plan(extra[STEER_KEY], len(getattr(request, "prompt_token_ids", None) or ()))
        if not isinstance(plan, dict) or STATE.secret is None or plan.get("secret") != STATE.secret:
            continue
        begin, end = int(starts[index]), int(starts[index + 1])
        if end > begin:
            active = _Active(plan, begin, end, int(positions[begin]))
            if "edits" in plan:
                STATE.step.append(active)
                continue
            if "run" in plan:
                _prepare_patch(active)
            if "capture" in plan or active.patch is not None or "noise" in plan:
                STATE.step.append(active)


@functools.lru_cache(maxsize=256)
def _steering_plan(text: str, prompt_len: int) -> dict[str, Any] | None:
    """A steering plan (the API server's stamped JSON, see steering.py) parsed once per request: each
    edit's vector as a tensor and its positions as a predicate over absolute positions."""
    try:
        plan = json.loads(text)
        edits = [{**edit, "vector": torch.tensor(edit["vector"], dtype=torch.float32) * float(edit["scale"])}
                 for edit in plan["edits"]]
    except (ValueError, KeyError, TypeError):
        return None
    return {"secret": plan.get("secret"), "edits": edits, "prompt_len": prompt_len}


def _steered_rows(active: _Active, where: dict[str, Any]) -> torch.Tensor:
    """The batch rows of ``active``'s chunk whose absolute positions ``where`` selects."""
    absolute = torch.arange(active.start, active.start + active.end - active.begin)
    prompt_len = active.plan["prompt_len"]
    keep = torch.zeros_like(absolute, dtype=torch.bool)
    for word in where["words"]:
        keep |= {"all": absolute >= 0, "prompt": absolute < prompt_len, "generated": absolute >= prompt_len}[word]
    if where["ints"]:
        keep |= torch.isin(absolute, torch.tensor(where["ints"], dtype=absolute.dtype))
    for start, stop in where["ranges"]:
        keep |= (absolute >= start) & (absolute < stop if stop is not None else True)
    return torch.nonzero(keep).flatten() + active.begin


def _rows_in_chunk(active: _Active, positions: list[int]) -> tuple[list[int], list[int]]:
    """Of ``positions`` (absolute), the indexes into that list and the batch rows of those in this step."""
    chunk = range(active.start, active.start + active.end - active.begin)
    picked = [i for i, p in enumerate(positions) if p in chunk]
    return picked, [active.begin + positions[i] - active.start for i in picked]


def _prepare_patch(active: _Active) -> None:
    plan = active.plan
    run = STORE.runs.get(plan["run"])
    source = run.acts.get((plan["hook"], plan["layer"])) if run is not None else None
    if source is None:
        log().warning("toolkit patch-sweep: run %r has no %s activations at layer %s; request not patched",
                       plan["run"], plan["hook"], plan["layer"])
        return
    positions = [p for p in plan["positions"] if p < source.shape[0]]
    picked, rows = _rows_in_chunk(active, positions)
    if rows:
        index = torch.tensor([positions[i] for i in picked], dtype=torch.long)
        active.patch = (torch.tensor(rows, dtype=torch.long), source[index])


def noise_rows(seed: int, count: int, width: int, scale: float) -> torch.Tensor:
    """The noise of a plan: row i (for the plan's i-th position) of a [count, width] standard normal draw
    from ``torch.Generator().manual_seed(seed)`` in float32, times ``scale`` (docs/patch-sweeps.md)."""
    generator = torch.Generator(device="cpu").manual_seed(int(seed))
    return torch.randn((count, width), generator=generator, dtype=torch.float32) * float(scale)


def _add_noise(hidden: torch.Tensor) -> torch.Tensor:
    """The first layer's input (the token embeddings) with each noised request's noise added."""
    hidden = hidden.clone()
    for active in STATE.step:
        noise = active.plan.get("noise")
        if not noise:
            continue
        picked, rows = _rows_in_chunk(active, list(noise["positions"]))
        if not rows:
            continue
        values = noise_rows(noise["seed"], len(noise["positions"]), hidden.shape[-1], noise["scale"])[picked]
        hidden[torch.tensor(rows, dtype=torch.long)] += values.to(device=hidden.device, dtype=hidden.dtype)
    return hidden


def _record(active: _Active, hook: str, layer: int, tensor: torch.Tensor) -> None:
    """Copy this step's rows of ``active``'s request from ``tensor`` into its capture buffer."""
    plan = active.plan
    buffers = STORE.pending.setdefault(plan["capture"], {})
    buffer = buffers.get((hook, layer))
    if buffer is None:
        buffer = buffers[(hook, layer)] = tensor.new_zeros((int(plan["n"]), tensor.shape[-1]))
    count = min(active.end - active.begin, buffer.shape[0] - active.start)
    if count > 0:
        buffer[active.start : active.start + count] = tensor[active.begin : active.begin + count]


def _record_part(layer: int, hook: str, tensor: torch.Tensor) -> None:
    """Capture a sublayer's own output (``attn_out``, ``mlp_out``): not the stream, so nothing to patch."""
    for active in STATE.step:
        plan = active.plan
        if "capture" in plan and layer in plan["layers"] and hook in plan["hooks"]:
            _record(active, hook, layer, tensor)


def _visit(layer: int, hook: str, hidden: torch.Tensor, residual: torch.Tensor | None):
    """Capture and patch the stream ``hidden (+ residual)`` at (hook, layer) for this step's requests.
    Returns the new ``(hidden, residual)`` when a row was patched, else None."""
    stream = None
    edits: list[tuple[torch.Tensor, torch.Tensor]] = []
    additions: list[tuple[torch.Tensor, torch.Tensor]] = []
    for active in STATE.step:
        plan = active.plan
        if "edits" in plan:
            for edit in plan["edits"]:
                if edit["layer"] == layer and edit["hook"] == hook:
                    rows = _steered_rows(active, edit["positions"])
                    if rows.numel():
                        additions.append((rows, edit["vector"]))
        elif "capture" in plan:
            if layer in plan["layers"] and hook in plan["hooks"]:
                stream = (hidden if residual is None else hidden + residual) if stream is None else stream
                _record(active, hook, layer, stream)
        elif active.patch is not None and plan["layer"] == layer and plan["hook"] == hook:
            stream = (hidden if residual is None else hidden + residual) if stream is None else stream
            rows, source = active.patch
            alpha = float(plan.get("alpha", 1.0))
            own = stream[rows]
            value = source.to(own.dtype) if alpha == 1.0 else (1.0 - alpha) * own + alpha * source.to(own.dtype)
            edits.append((rows, value))
    if not edits and not additions:
        return None
    hidden = hidden.clone()
    residual = None if residual is None else residual.clone()
    for rows, value in edits:
        hidden[rows] = value
        if residual is not None:
            residual[rows] = 0
    for rows, vector in additions:  # the stream is hidden + residual: adding to hidden adds to the stream
        hidden[rows] += vector.to(device=hidden.device, dtype=hidden.dtype)
    return hidden, residual


# --------------------------------------------------------------------------------------------------
# the hooks


def _split_layer_args(args: tuple, kwargs: dict) -> tuple[Any, Any, Any]:
    names = ("positions", "hidden_states", "residual")
    values = list(args[:3]) + [kwargs.get(name) for name in names[len(args[:3]):]]
    return values[0], values[1], values[2]


def _rebuild_layer_args(args: tuple, kwargs: dict, hidden: Any, residual: Any) -> tuple[tuple, dict]:
    positional, kwargs = list(args), dict(kwargs)
    for index, (name, value) in enumerate((("hidden_states", hidden), ("residual", residual)), start=1):
        if len(positional) > index:
            positional[index] = value
        else:
            kwargs[name] = value
    return tuple(positional), kwargs


def _layer_pre_hook(layer: int):
    def hook(module, args, kwargs):
        if STATE.bypass:
            return None
        positions, hidden, residual = _split_layer_args(args, kwargs)
        noised = False
        if module is STATE.first_layer:
            _begin_step(positions, hidden.shape[0])
            if any("noise" in active.plan for active in STATE.step):
                hidden, noised = _add_noise(hidden), True
        if not STATE.step:
            return None
        new = _visit(layer, "pre_attn", hidden, residual)
        if new is None:
            return _rebuild_layer_args(args, kwargs, hidden, residual) if noised else None
        return _rebuild_layer_args(args, kwargs, *new)

    return hook


def _post_attn_pre_hook(layer: int):
    def hook(module, args):
        if STATE.bypass or not STATE.step or len(args) < 2 or args[1] is None:
            return None
        _record_part(layer, "attn_out", args[0])
        new = _visit(layer, "post_attn", args[0], args[1])
        return None if new is None else (new[0], new[1], *args[2:])

    return hook


def _layer_hook(layer: int):
    def hook(module, args, output):
        if STATE.bypass or not STATE.step or not isinstance(output, tuple) or len(output) < 2:
            return None
        _record_part(layer, "mlp_out", output[0])
        new = _visit(layer, "post_block", output[0], output[1])
        return None if new is None else (new[0], new[1], *output[2:])

    return hook


def _decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and name.split(".")[-1] == "layers" and len(module):
            if all(hasattr(layer, "post_attention_layernorm") for layer in module):
                return list(module)
    raise RuntimeError("patch-sweep: no decoder layers (a ModuleList `layers` whose layers have "
                       "post_attention_layernorm) in this model")


# --------------------------------------------------------------------------------------------------
# collective_rpc("toolkit_patch_sweep_<op>") targets; the first argument is the worker wrapper


def _runner_of(wrapper: Any) -> Any:
    worker = getattr(wrapper, "worker", None) or wrapper
    return worker.model_runner


def install(wrapper: Any, secret: str, max_bytes: int) -> dict[str, Any]:
    """Register the hooks once (idempotent) and take the API server's secret and memory bound."""
    STATE.secret = secret
    STORE.max_bytes = int(max_bytes)
    if not STATE.handles:
        runner = _runner_of(wrapper)
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        layers = _decoder_layers(model)
        for index, layer in enumerate(layers):
            STATE.handles.append(layer.register_forward_pre_hook(_layer_pre_hook(index), with_kwargs=True))
            STATE.handles.append(_post_attn_norm(layer).register_forward_pre_hook(_post_attn_pre_hook(index)))
            STATE.handles.append(layer.register_forward_hook(_layer_hook(index)))
        STATE.runner, STATE.first_layer, STATE.num_layers = runner, layers[0], len(layers)
        STATE.embedding_moments = _embedding_moments(model, runner)
        STATE.bypass = True  # the probe drives the layers itself: the hooks stand aside
        try:
            STATE.executor = probed_executor(model, layers, runner)
        finally:
            STATE.bypass = False
        log().info("toolkit patch-sweep: forward hooks on %d decoder layers; sweeps of pre_attn and post_block %s",
                   len(layers), "run batched" if STATE.executor.unsupported is None
                   else f"run by requests: {STATE.executor.unsupported}")
    return {"num_layers": STATE.num_layers, "max_bytes": STORE.max_bytes,
            "embedding_moments": list(STATE.embedding_moments), "batched_unsupported": STATE.executor.unsupported}


def _post_attn_norm(layer: torch.nn.Module) -> torch.nn.Module:
    """The norm whose input is ``(attention's addition, residual)``, the stream after attention: the pre-MLP
    ``post_attention_layernorm`` of a Llama-style layer; with sandwich norms (Gemma 2 and 3, whose
    ``post_attention_layernorm`` normalizes the attention output alone) the ``pre_feedforward_layernorm``
    after it, so ``attn_out`` is what attention adds to the stream there too."""
    sandwich = getattr(layer, "pre_feedforward_layernorm", None)
    return sandwich if isinstance(sandwich, torch.nn.Module) else layer.get_submodule("post_attention_layernorm")


def _embedding_moments(model: torch.nn.Module, runner: Any) -> tuple[float, float, float]:
    """(count, sum, sum of squares) of this rank's real rows of the token embedding matrix: vLLM pads
    the vocabulary, and with tensor parallelism each rank holds a slice of the rows, so the API server
    adds every rank's moments up before taking the standard deviation (engine.merge_install)."""
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if name.split(".")[-1] != "embed_tokens" or not isinstance(weight, torch.Tensor):
            continue
        shard = getattr(module, "shard_indices", None)
        if shard is not None:  # VocabParallelEmbedding: [org rows | padding | added rows | padding]
            rows = [weight[: shard.num_org_elements],
                    weight[shard.num_org_elements_padded : shard.num_org_elements_padded + shard.num_added_elements]]
        else:
            rows = [weight[: int(runner.model_config.get_vocab_size())]]
        values = torch.cat([r.detach().to(torch.float64).reshape(-1) for r in rows])
        return float(values.numel()), float(values.sum()), float((values * values).sum())
    return 0.0, 0.0, 0.0


def batched_sweep(wrapper: Any, key: str, name: str, hook: str, cells: list[tuple[int, list[int]]],
                  scored: list[int], alpha: float, keep: bool = False) -> dict[str, Any]:
    """Cells of a sweep in this call (batched.py): ``key`` is the capture of the corrupt run's input to
    layer 0 (noise included), ``name`` the stored clean run, ``cells`` ``(layer, positions)``. ``keep``:
    more calls of the same sweep follow (the server discards the capture after the last)."""
    acts = (STORE.pending.get(key) if keep else STORE.pending.pop(key, None)) or {}
    embedded = acts.get(("pre_attn", 0))
    run = STORE.runs.get(name)
    if embedded is None or run is None:
        return {"error": f"the corrupt run's capture or run {name!r} is gone"}
    if STATE.executor is None or STATE.executor.unsupported:
        return {"unsupported": getattr(STATE.executor, "unsupported", None) or "not installed"}
    planned = []
    for layer, positions in cells:
        source = run.acts.get((hook, layer))
        if source is None:
            return {"error": f"run {name!r} has no {hook} activations at layer {layer}"}
        first = layer if hook == "pre_attn" else layer + 1
        planned.append((first, list(positions), source[torch.tensor(positions, dtype=torch.long)]))
    STATE.bypass = True
    try:
        with torch.inference_mode():
            return STATE.executor.sweep(embedded, planned, list(scored), float(alpha))
    except Exception as exc:  # the probe passed and this did not: never a failed request; by requests from now on
        STATE.executor.unsupported = f"the batched executor failed ({failure(exc)})"
        log().warning("toolkit patch-sweep: %s; sweeps run by requests from now on", STATE.executor.unsupported)
        return {"unsupported": STATE.executor.unsupported}
    finally:
        STATE.bypass = False


RPC: dict[str, Callable[..., Any]] = {"install": install, "batched_sweep": batched_sweep, "commit": store.commit, "discard": store.discard,
       "take": store.take, "runs": store.runs, "run": store.run, "delete": store.delete}
