"""API-server side of patch-sweep: the HTTP routes.

Loaded only when patching is enabled (``runtime.attach_routes``). A route reads its JSON body
(bodies.py), makes it concrete against the served model (sweep.py, activations.py) and runs it through
the engine (engine_client.py, execution.py).

Routes:
  POST   /v1/patch_runs          capture a prompt's activations under a run name
  GET    /v1/patch_runs          list stored runs (bytes used, bound) and whether sweeps can run batched
  GET    /v1/patch_runs/{name}   one run, with its prompt token ids
  DELETE /v1/patch_runs/{name}   drop a run
  POST   /v1/patch_sweep         the grid (``stream: true`` for SSE: start, cell..., summary, [DONE])
  POST   /v1/activations         a prompt's activations (JSON with base64 arrays, or safetensors)

Every mistake in a request is a 400 whose ``error.message`` says what to change; the server stays up.
"""

# No ``from __future__ import annotations``: FastAPI reads the handlers' annotations (``Request``,
# imported inside ``attach``) as objects.
import json
import uuid
from typing import Any

from toolkit.patches.vllm.patch_sweep.activations import prepare_activations, run_activations
from toolkit.patches.vllm.patch_sweep.bodies import HOOKS, CaptureBody, encode_prompt, parse_body, parse_layers
from toolkit.patches.vllm.patch_sweep.engine_client import Engine, engine_of
from toolkit.patches.vllm.patch_sweep.refusals import BadRequest, error_response
from toolkit.patches.vllm.patch_sweep.execution import run_sweep
from toolkit.patches.vllm.patch_sweep.sweep import prepare_sweep


async def _body(raw: Any) -> Any:
    try:
        return await raw.json()
    except Exception:
        raise BadRequest("the request body is not valid JSON") from None


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
            return error_response(str(exc), exc.status)

    @router.post("/v1/patch_runs")
    async def capture_run(raw: Request):
        async def handler(engine: Engine):
            request = parse_body(CaptureBody, await _body(raw))
            name = request.name or f"run-{uuid.uuid4().hex[:12]}"
            hooks: list[str] = list(request.hooks or HOOKS)
            layers = parse_layers(request.layers, engine.num_layers)
            ids = encode_prompt(await engine.tokenizer(), request.prompt, engine.max_model_len)
            info = await engine.capture(name, request.prompt, ids, layers, list(dict.fromkeys(hooks)))
            return JSONResponse({**info, "prompt_token_ids": ids})

        return await guarded(raw, handler)

    @router.get("/v1/patch_runs")
    async def list_runs(raw: Request):
        async def handler(engine: Engine):
            # which way this model's pre_attn and post_block sweeps run, known from install (the probe)
            batched = {"available": engine.batched_unsupported is None, "reason": engine.batched_unsupported}
            return JSONResponse({**await engine.rpc("runs"), "batched_executor": batched})

        return await guarded(raw, handler)

    @router.get("/v1/patch_runs/{name}")
    async def get_run(name: str, raw: Request):
        async def handler(engine: Engine):
            info = await engine.rpc("run", name)
            return error_response(f"unknown run {name!r}", 404) if info is None else JSONResponse(info)

        return await guarded(raw, handler)

    @router.delete("/v1/patch_runs/{name}")
    async def delete_run(name: str, raw: Request):
        async def handler(engine: Engine):
            if not await engine.rpc("delete", name):
                return error_response(f"unknown run {name!r}", 404)
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
