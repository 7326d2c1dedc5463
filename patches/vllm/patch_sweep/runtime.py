"""What the patched vLLM files call; kept import-light (it is imported by every vLLM process).

* ``attach_routes(app)`` (API server, from ``build_app``): the patch-sweep routes, only when patching
  is enabled (``TOOLKIT_ENABLE_PATCHING=1``); otherwise nothing is added and nothing runs.
* ``force_eager(engine_args)`` (API server, before the engine config is built): forward hooks on the
  decoder layers fire only in eager mode, so enabled patching turns ``enforce_eager`` on and logs it;
  it refuses pipeline parallelism at start-up (``PIPELINE_REFUSAL``), where no worker holds every layer.
* ``worker_method(wrapper, name)`` (every worker, from ``WorkerWrapperBase.__getattr__``): the worker
  side of ``collective_rpc("toolkit_patch_sweep_<op>")``; other names fall through to vLLM.
* ``private_block_keys(request, start, end)`` (engine core, from ``generate_block_hash_extra_keys``):
  prefix reuse for sweep cells (below).

Nothing here imports the patch engine, libcst, torch or FastAPI at import time.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from toolkit.patches.vllm.patch_sweep.shared import (ENABLE_ENV, PLAN_KEY, SHARED_PREFIX, STEERING_ENV, WORKER_PREFIX,
                                                     enabled, log, steering_enabled)

__all__ = ["ENABLE_ENV", "PIPELINE_REFUSAL", "STEERING_ENV", "attach_routes", "enabled", "force_eager", "private_block_keys",
           "steering_enabled", "worker_method"]



def attach_routes(app: Any) -> None:
    if enabled():
        from toolkit.patches.vllm.patch_sweep import routes

        routes.attach(app)
        log().info("toolkit patch-sweep: /v1/patch_runs, /v1/patch_sweep and /v1/activations enabled (%s=1); "
                   "sweep requests skip reading the prefix cache and carry their own cache_salt", ENABLE_ENV)
    if enabled() or steering_enabled():
        from toolkit.patches.vllm.patch_sweep import steering

        steering.attach(app)
        log().info("toolkit patch-sweep: steering on chat and completions requests is %s (%s=1 turns it on); "
                   "steered requests carry their own cache_salt",
                   "on" if steering_enabled() else "off", STEERING_ENV)


# A sweep, a capture and steering read and patch every decoder layer inside each worker's own forward
# pass; a pipeline stage holds only its layers (the others are placeholders), so a run would see some
# layers and not others. Refused at start, never a wrong grid. (On CPU the engine itself also fails its
# first request with pipeline stages under --enforce-eager, which the hooks need: docs/scale.md.)
PIPELINE_REFUSAL = (
    "toolkit patch-sweep: {enable}=1 or {steer}=1 cannot run with --pipeline-parallel-size {stages}, because a "
    "pipeline stage holds only its own decoder layers and sweeps, captures and steering need every layer in "
    "each worker; use --tensor-parallel-size or --data-parallel-size, or start without those variables"
)


def force_eager(engine_args: Any) -> None:
    if not (enabled() or steering_enabled()):
        return
    stages = getattr(engine_args, "pipeline_parallel_size", 1)
    if isinstance(stages, int) and stages > 1:
        raise SystemExit(PIPELINE_REFUSAL.format(enable=ENABLE_ENV, steer=STEERING_ENV, stages=stages))
    if getattr(engine_args, "enforce_eager", True):
        return
    engine_args.enforce_eager = True
    log().warning(
        "toolkit patch-sweep: %s=1 or %s=1 turns on --enforce-eager (forward hooks on the decoder layers do "
        "not run in compiled mode)", ENABLE_ENV, STEERING_ENV,
    )


def worker_method(wrapper: Any, name: str) -> Callable[..., Any] | None:
    if not isinstance(name, str) or not name.startswith(WORKER_PREFIX):
        return None
    from toolkit.patches.vllm.patch_sweep import worker

    function = worker.RPC.get(name[len(WORKER_PREFIX):])
    return None if function is None else functools.partial(function, wrapper)


def private_block_keys(request: Any, start_token_idx: int, end_token_idx: int) -> list[tuple[str, str]]:
    """Extra block-hash keys that make a sweep cell's blocks from its first patched position on unique.

    A sweep shares one secret ``cache_salt`` among its corrupt run and its cells, and each cell's plan
    says ``shared_prefix``: its first patched position p. Positions before p compute exactly what the
    corrupt run computed, so the blocks wholly before p keep their ordinary hash (the cell reads them
    from the prefix cache: only the rest is recomputed); every block reaching p or beyond may hold
    patched KV and gets the request's own id as a key, so its hash (and every later block's, by the
    chain) matches no other request: a patched block is never served, not even to the same sweep.
    Anything else (no plan, no ``shared_prefix``) is left as vLLM has it. A client writing such a plan
    into ``vllm_xargs`` only makes its own blocks private: the key can never widen sharing."""
    params = getattr(request, "sampling_params", None)
    extra = getattr(params, "extra_args", None)
    plan = extra.get(PLAN_KEY) if isinstance(extra, dict) else None
    shared = plan.get(SHARED_PREFIX) if isinstance(plan, dict) else None
    if isinstance(shared, int) and not isinstance(shared, bool) and end_token_idx > shared:
        return [("toolkit_private", str(request.request_id))]
    return []
