"""What a client may send to the patch-sweep routes: each JSON body as a pydantic model, and the one
sentence a client gets back for a wrong field (``parse_body``).

pydantic finds the wrong field; the sentence is this module's (``SENTENCES``), so a 400 reads as it
always has and names the field. Unknown fields are named before anything else. Two fields a model
cannot check alone are resolved here too, against the served model: ``layers`` (a list, a range or
``"all"``, within the model's layer count) and a prompt's tokens (within its context length).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Optional, TypeVar, get_args

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictStr, ValidationError,
                      ValidationInfo, field_validator, model_validator)

from toolkit.patches.common.spans import ALL_PROMPT
from toolkit.patches.vllm.patch_sweep.refusals import BadRequest

# Each choice once, as the field's type; the tuples (for messages and the other modules) are read from it.
Hook = Literal["pre_attn", "post_attn", "post_block"]  # points of the residual stream: captured and patched
ActivationHook = Literal[Hook, "attn_out", "mlp_out"]  # and what attention and the MLP add to it: captured only
Metric = Literal["logprob", "logit_diff", "recovered"]
Executor = Literal["auto", "batched", "requests"]
Encoding = Literal["base64", "safetensors"]
HOOKS: tuple[str, ...] = get_args(Hook)
ACTIVATION_HOOKS: tuple[str, ...] = get_args(ActivationHook)
METRICS: tuple[str, ...] = get_args(Metric)
EXECUTORS: tuple[str, ...] = get_args(Executor)
ENCODINGS: tuple[str, ...] = get_args(Encoding)


def _in_vocabulary(token_id: int, info: ValidationInfo) -> int:
    context: dict[str, Any] = info.context or {}  # parse_body always passes one
    if not 0 <= token_id <= context["last_token_id"]:
        raise ValueError("not in the vocabulary")  # the client reads the field's sentence, not this
    return token_id


Text = Annotated[str, Field(strict=True, min_length=1)]
Number = Annotated[float, Field(strict=True, allow_inf_nan=False)]  # an integer is one too; true is not
TokenId = Annotated[int, Field(strict=True), AfterValidator(_in_vocabulary)]


def _text(name: str) -> str:
    return f"{name} must be a non-empty string"


def _one_of(name: str, choices: tuple[str, ...]) -> str:
    return f"{name} must be one of {', '.join(choices)}, got %(input)r"


class Body(BaseModel):
    """A request body: the declared fields and no others. ``SENTENCES`` holds, for each field (dotted
    for a nested one), what a client is told when it is wrong: ``%(input)r`` is the value sent, other
    ``%(...)`` names come from the context ``parse_body`` gets."""

    model_config = ConfigDict(extra="forbid")
    SENTENCES: ClassVar[dict[str, str]] = {}


class NoiseBody(Body):
    positions: Any  # spans or integers, resolved against the prompt (common.spans)
    seed: Annotated[int, Field(strict=True, ge=0, lt=2**63)] = 0
    scale: Optional[Annotated[Number, Field(ge=0)]] = None  # None: 3x the embeddings' std (sweep.py)


class SweepBody(Body):
    """POST /v1/patch_sweep. The fields are in the order they are checked: the first wrong one is named."""

    model: Any = None
    prompt: Text
    source_run: Optional[Text] = None
    clean_prompt: Optional[Text] = None
    hook: Hook = "post_block"
    metric: Metric = "logprob"  # unsent: logit_diff when a foil is given (below)
    answer_token: Optional[Text] = None
    answer_token_id: Optional[TokenId] = None
    foil_token: Optional[Text] = None
    foil_token_id: Optional[TokenId] = None
    alpha: Number = 1.0
    baselines: StrictBool = True
    prefix_reuse: StrictBool = True
    executor: Executor = "auto"
    stream: StrictBool = False
    layers: Any = None  # parse_layers
    positions: Any = ALL_PROMPT  # sweep.resolve_columns
    noise: Optional[NoiseBody] = None

    SENTENCES = {
        "prompt": _text("prompt"), "source_run": _text("source_run"), "clean_prompt": _text("clean_prompt"),
        "hook": _one_of("hook", HOOKS), "metric": _one_of("metric", METRICS),
        "answer_token": _text("answer_token"), "foil_token": _text("foil_token"),
        "answer_token_id": "answer_token_id must be an integer in 0..%(last_token_id)d",
        "foil_token_id": "foil_token_id must be an integer in 0..%(last_token_id)d",
        "alpha": "alpha must be a finite number (1 replaces, other values interpolate)",
        "baselines": "baselines must be true or false", "prefix_reuse": "prefix_reuse must be true or false",
        "executor": _one_of("executor", EXECUTORS), "stream": "stream must be true or false",
        "noise": 'noise must be {"positions": [...], "seed": int, "scale": number (optional)}',
        "noise.positions": 'noise.positions is required (the tokens whose embeddings get noise, e.g. [{"span": "Paris"}])',
        "noise.seed": "noise.seed must be a non-negative integer",
        "noise.scale": "noise.scale must be a finite number >= 0 (omit it for 3x the embeddings' std)",
    }

    @model_validator(mode="after")
    def _fields_agree(self) -> SweepBody:
        if "metric" not in self.model_fields_set and (self.foil_token is not None or self.foil_token_id is not None):
            self.metric = "logit_diff"
        for name, required in (("answer", True), ("foil", self.metric == "logit_diff")):
            text, token_id = getattr(self, f"{name}_token"), getattr(self, f"{name}_token_id")
            if text is not None and token_id is not None:
                raise ValueError(f"give {name}_token or {name}_token_id, not both")
            if required and text is None and token_id is None:
                raise ValueError(f"{name}_token (a string that is one token) or {name}_token_id is required")
        if self.metric == "recovered" and not self.baselines:
            raise ValueError("metric recovered needs the baselines; drop baselines: false")
        return self


class CaptureBody(Body):
    """POST /v1/patch_runs."""

    model: Any = None
    prompt: Text
    name: Optional[Text] = None
    hooks: Optional[Annotated[list[Hook], Field(strict=True)]] = None  # None: every hook
    layers: Any = None  # parse_layers

    SENTENCES = {"prompt": _text("prompt"), "name": _text("name"),
                 "hooks": f"hooks must be a list drawn from {', '.join(HOOKS)}"}

    @field_validator("hooks", mode="before")
    @classmethod
    def _empty_is_every_hook(cls, value: Any) -> Any:
        return value or None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")  # a template may read more than role and content
    role: StrictStr
    content: StrictStr


class ActivationBody(Body):
    """POST /v1/activations: one of prompt, messages or prompt_token_ids."""

    model: Any = None
    prompt: Optional[Text] = None
    messages: Optional[Annotated[list[Message], Field(strict=True, min_length=1)]] = None
    prompt_token_ids: Optional[Annotated[list[TokenId], Field(strict=True, min_length=1)]] = None
    hooks: Annotated[list[ActivationHook], Field(strict=True, min_length=1)] = ["post_block"]
    layers: Any = None  # parse_layers
    positions: Any = ALL_PROMPT  # spans need a text prompt (activations.py)
    encoding: Encoding = "base64"

    SENTENCES = {
        "prompt": _text("prompt"), "messages": 'messages must be a non-empty list of {"role": str, "content": str}',
        "prompt_token_ids": "prompt_token_ids must be a non-empty list of token ids in 0..%(last_token_id)d",
        "hooks": f"hooks must be a non-empty list drawn from {', '.join(ACTIVATION_HOOKS)}",
        "encoding": _one_of("encoding", ENCODINGS),
    }

    @model_validator(mode="after")
    def _one_prompt(self) -> ActivationBody:
        if [self.prompt, self.messages, self.prompt_token_ids].count(None) != 2:
            raise ValueError("give exactly one of prompt (text), messages (chat) or prompt_token_ids")
        return self


B = TypeVar("B", bound=Body)


def parse_body(model: type[B], body: Any, **context: Any) -> B:
    """``body`` as ``model``, or a BadRequest naming its first mistake. ``context`` is what a check or
    a sentence needs of the served model (``last_token_id``)."""
    try:
        return model.model_validate(body, context=context)
    except ValidationError as exc:
        errors = sorted(exc.errors(), key=lambda error: error["type"] != "extra_forbidden")
        raise BadRequest(_sentence(model, errors, context)) from None


def _sentence(model: type[Body], errors: list[Any], context: dict[str, Any]) -> str:
    first = errors[0]
    names = [part for part in first["loc"] if isinstance(part, str)]  # list indexes dropped
    if first["type"] == "extra_forbidden":
        where = names[:-1]
        unknown = sorted(str(e["loc"][-1]) for e in errors
                         if e["type"] == "extra_forbidden" and e["loc"][:-1] == first["loc"][:-1])
        allowed = sorted(_model_at(model, where).model_fields)
        prefix = f"{'.'.join(where)} " if where else ""
        return f"unknown {prefix}field(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}"
    if not names:  # the body itself: not an object, or fields that disagree (a model validator's sentence)
        return str(first["ctx"]["error"]) if first["type"] == "value_error" else "the request body must be a JSON object"
    for end in range(len(names), 0, -1):
        sentence = model.SENTENCES.get(".".join(names[:end]))
        if sentence is not None:
            return sentence % {"input": first.get("input"), **context}
    return f"{'.'.join(names)}: {first['msg']}"  # a field without a sentence of its own: pydantic's words


def _model_at(model: type[BaseModel], path: list[str]) -> type[BaseModel]:
    """The model of the nested field at ``path`` (``["noise"]``: NoiseBody)."""
    for name in path:
        annotation = model.model_fields[name].annotation
        model = next(t for t in (annotation, *get_args(annotation)) if isinstance(t, type) and issubclass(t, BaseModel))
    return model


# --------------------------------------------------------------------------------------------------
# fields checked against the served model


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


def encode_prompt(tokenizer: Any, prompt: str, max_model_len: int, name: str = "prompt",
                  add_special_tokens: bool = True) -> list[int]:
    """``prompt``'s token ids: at least one, and room left for the one token a sweep scores."""
    ids = [int(i) for i in tokenizer.encode(prompt, add_special_tokens=add_special_tokens)]
    if not ids:
        raise BadRequest(f"{name} encodes to no tokens")
    if len(ids) >= max_model_len:
        raise BadRequest(f"{name} is {len(ids)} tokens; the model's limit is {max_model_len - 1} for a sweep")
    return ids
