"""API-server side of steering: additive vectors on the residual stream of chat and completions requests.

With ``TOOLKIT_ENABLE_STEERING=1`` a request to ``/v1/completions`` or ``/v1/chat/completions`` may carry

    "steering": [{"layer": 1, "vector": [... hidden_size floats ...], "hook": "post_block",
                  "positions": "all" | "prompt" | "generated" | [int, {"span": str}, {"start": int, "stop": int}],
                  "scale": 1.0}, ...]

(data, never code). An ASGI middleware in front of vLLM checks it (a 400 for every bad field), removes it
from the body and hands it to the worker as ``vllm_xargs["toolkit_steer"]``: a JSON string stamped
with the API server's secret, so a plan a client writes into ``vllm_xargs`` itself is ignored. Each
steered request also gets a fresh ``cache_salt``: its KV blocks (steered from the first steered
position on) are never read by another request, and it never reads blocks an unsteered request wrote.
Without the switch a request carrying ``steering`` is a 400 (when patching is enabled; with neither
switch nothing is added and nothing runs).
"""

from __future__ import annotations

import json
import math
import secrets
from typing import Any

from toolkit.patches.common.spans import SpanError, prompt_char_offsets, resolve_positions
from toolkit.patches.vllm.patch_sweep.bodies import HOOKS, parse_layers
from toolkit.patches.vllm.patch_sweep.engine_client import Engine, engine_of
from toolkit.patches.vllm.patch_sweep.refusals import BadRequest, error_response
from toolkit.patches.vllm.patch_sweep.shared import STEER_KEY, steering_enabled

STEERED_PATHS = ("/v1/completions", "/v1/chat/completions")
ENTRY_FIELDS = {"layer", "vector", "hook", "positions", "scale"}
POSITION_WORDS = ("all", "prompt", "generated")


def _positions(value: Any, body: dict[str, Any], tokenizer: Any, where: str) -> dict[str, Any]:
    """A steering entry's positions as the worker's predicate: {"words", "ints", "ranges"}."""
    if value in POSITION_WORDS:
        return {"words": [value], "ints": [], "ranges": []}
    if not isinstance(value, list) or not value:
        raise BadRequest(f"{where}.positions must be \"all\", \"prompt\", \"generated\" or a non-empty list of "
                         f"integers, spans and {{\"start\", \"stop\"}} ranges")
    ints: list[int] = []
    ranges: list[list[int | None]] = []
    spans: list[dict] = []
    for item in value:
        if isinstance(item, int) and not isinstance(item, bool):
            if item < 0:
                raise BadRequest(f"{where}.positions: position {item} is negative")
            ints.append(item)
        elif isinstance(item, dict) and "span" not in item:
            start, stop = item.get("start", 0), item.get("stop")
            if (set(item) - {"start", "stop"} or isinstance(start, bool) or not isinstance(start, int) or start < 0
                    or (stop is not None and (isinstance(stop, bool) or not isinstance(stop, int) or stop <= start))):
                raise BadRequest(f"{where}.positions: a range is {{\"start\": int >= 0, \"stop\": int > start "
                                 f"(omit for no end)}}, got {item!r}")
            ranges.append([start, stop])
        else:
            spans.append(item)
    if spans:
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise BadRequest(f"{where}.positions: spans need a completions request with a text prompt; give "
                             f"positions as integers or ranges")
        ids = tokenizer.encode(prompt, add_special_tokens=body.get("add_special_tokens", True) is not False)
        try:
            ints += resolve_positions(spans, prompt_char_offsets(tokenizer, prompt, ids))
        except SpanError as exc:
            raise BadRequest(f"{where}.positions: {exc}") from None
    return {"words": [], "ints": sorted(set(ints)), "ranges": ranges}


async def parse_steering(engine: Engine, value: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not value:
        raise BadRequest("steering must be a non-empty list of {\"layer\", \"vector\", \"positions\", \"hook\", \"scale\"}")
    tokenizer = None
    edits = []
    for index, entry in enumerate(value):
        where = f"steering[{index}]"
        if not isinstance(entry, dict):
            raise BadRequest(f"{where} must be an object with layer, vector and optional hook, positions, scale")
        unknown = sorted(set(entry) - ENTRY_FIELDS)
        if unknown:
            raise BadRequest(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(ENTRY_FIELDS))}")
        layer = entry.get("layer")
        if isinstance(layer, bool) or not isinstance(layer, int):
            raise BadRequest(f"{where}.layer must be an integer")
        try:
            parse_layers([layer], engine.num_layers)
        except BadRequest as exc:
            raise BadRequest(f"{where}: {exc}") from None
        hook = entry.get("hook", "post_block")
        if hook not in HOOKS:
            raise BadRequest(f"{where}.hook must be one of {', '.join(HOOKS)}, got {hook!r}")
        vector = entry.get("vector")
        if (not isinstance(vector, list) or len(vector) != engine.hidden_size or not all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in vector)):
            raise BadRequest(f"{where}.vector must be a list of {engine.hidden_size} finite numbers (the model's "
                             f"hidden size)")
        scale = entry.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
            raise BadRequest(f"{where}.scale must be a finite number")
        positions = entry.get("positions", "all")
        if isinstance(positions, list) and any(isinstance(p, dict) and "span" in p for p in positions) and tokenizer is None:
            tokenizer = await engine.tokenizer()
        edits.append({"layer": layer, "hook": hook, "vector": [float(x) for x in vector], "scale": float(scale),
                      "positions": _positions(positions, body, tokenizer, where)})
    return edits


async def rewrite(engine: Engine, body: dict[str, Any]) -> dict[str, Any]:
    """The request with ``steering`` moved into ``vllm_xargs`` (stamped) and a fresh ``cache_salt``."""
    if not steering_enabled():
        raise BadRequest("steering is off on this server; start it with TOOLKIT_ENABLE_STEERING=1")
    await engine.ensure_installed()
    edits = await parse_steering(engine, body.pop("steering"), body)
    xargs = body.get("vllm_xargs") or {}
    if not isinstance(xargs, dict):
        raise BadRequest("vllm_xargs must be an object")
    plan = json.dumps({"secret": engine.secret, "edits": edits}, separators=(",", ":"))
    salt = body.get("cache_salt")
    body["vllm_xargs"] = {**xargs, STEER_KEY: plan}
    body["cache_salt"] = f"{salt if isinstance(salt, str) else ''}toolkit-steer-{secrets.token_hex(8)}"
    return body


class SteeringMiddleware:
    """Pure ASGI: reads the body of a chat/completions POST only when it mentions ``steering``."""

    def __init__(self, app: Any):
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope.get("type") != "http" or scope.get("method") != "POST" or scope.get("path") not in STEERED_PATHS:
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                return await self.app(scope, receive, send)
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        raw = b"".join(chunks)
        if b'"steering"' in raw:
            try:
                body = json.loads(raw)
                if isinstance(body, dict) and "steering" in body:
                    raw = json.dumps(await rewrite(engine_of(scope["app"]), body)).encode()
            except BadRequest as exc:
                return await error_response(str(exc), exc.status)(scope, receive, send)
            except ValueError:
                pass  # not JSON: vLLM answers that itself
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(raw)).encode()))
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": raw, "more_body": False}
            return await receive()

        await self.app({**scope, "headers": headers}, replay, send)


def attach(app: Any) -> None:
    app.add_middleware(SteeringMiddleware)
