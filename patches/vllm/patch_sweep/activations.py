"""POST /v1/activations: a prompt's activations at chosen hooks, layers and positions, read in one
forward pass (the worker records them, then hands them over as plain data: ``Engine.activations``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from toolkit.patches.common.spans import ALL_PROMPT, SpanError, TokenOffsets, prompt_char_offsets, resolve_positions
from toolkit.patches.vllm.patch_sweep.bodies import ActivationBody, Message, encode_prompt, parse_body, parse_layers
from toolkit.patches.vllm.patch_sweep.engine_client import Engine
from toolkit.patches.vllm.patch_sweep.refusals import BadRequest

MAX_ACTIVATION_BYTES_ENV = "TOOLKIT_ACTIVATIONS_MAX_BYTES"
DEFAULT_MAX_ACTIVATION_BYTES = 64 << 20


@dataclass
class ActivationRequest:
    token_ids: list[int]
    hooks: list[str]
    layers: list[int]
    positions: list[int]
    encoding: str
    position_tokens: list[str]


async def prepare_activations(engine: Engine, body: Any) -> ActivationRequest:
    request = parse_body(ActivationBody, body, last_token_id=engine.vocab_size - 1)
    tokenizer = await engine.tokenizer()
    text = None
    if request.prompt is not None:
        text = request.prompt
        ids = encode_prompt(tokenizer, text, engine.max_model_len)
    elif request.messages is not None:
        text = _chat_text(tokenizer, request.messages)
        ids = encode_prompt(tokenizer, text, engine.max_model_len, "messages", add_special_tokens=False)
    else:
        ids = request.prompt_token_ids or []  # ActivationBody asks for exactly one of the three
        if len(ids) >= engine.max_model_len:
            raise BadRequest(f"prompt_token_ids is {len(ids)} tokens; the model's limit is {engine.max_model_len - 1}")
    layers = parse_layers(request.layers, engine.num_layers)
    positions_value = request.positions
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
    hooks: list[str] = list(dict.fromkeys(request.hooks))
    size = len(positions) * len(layers) * len(hooks) * engine.hidden_size * engine.item_size
    bound = int(os.environ.get(MAX_ACTIVATION_BYTES_ENV, DEFAULT_MAX_ACTIVATION_BYTES))
    if size > bound:
        raise BadRequest(f"the activations would take {size} bytes ({len(layers)} layers x {len(hooks)} hooks x "
                         f"{len(positions)} positions x {engine.hidden_size} x {engine.item_size} bytes), over this "
                         f"server's bound of {bound} ({MAX_ACTIVATION_BYTES_ENV}); ask for fewer layers, hooks or positions")
    return ActivationRequest(list(map(int, ids)), hooks, layers, positions, request.encoding,
                             [tokenizer.decode([i]) for i in ids])


def _no_text(count: int) -> TokenOffsets:
    return TokenOffsets("", tuple((0, 0) for _ in range(count)), "token_ids")


def _chat_text(tokenizer: Any, messages: list[Message]) -> str:
    try:
        return tokenizer.apply_chat_template([m.model_dump() for m in messages], tokenize=False,
                                             add_generation_prompt=True)
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
