"""What the patched SGLang chat serving calls: token ids on chat completions, stream and non-stream.

Runs inside the engine's process, so it imports the standard library only.

Wire contract (the field names vLLM uses):

- non-streaming: ``prompt_token_ids`` on the response, ``token_ids`` on each choice;
- streaming: ``prompt_token_ids`` on the first chunk, ``token_ids`` on every choice chunk that
  carries text (content, reasoning or tool calls) or the finish reason: the ids behind that text.

On when the request says ``return_token_ids: true`` or the server runs with
``TOOLKIT_RETURN_TOKEN_IDS=1``. Otherwise nothing here touches a response: the stream generator is
returned as it is and the new response fields are left out of the JSON, not sent as null.

Streaming works on the SSE strings the serving code yields, so it holds whatever builds them
(pydantic models, msgspec structs, parser helpers): :func:`tap` sees every engine output and
:class:`StreamTokenIds` turns each choice's ``output_ids`` (cumulative by default, only the new ids
with SGLang's incremental streaming flag) into pending ids, which the next chunk of that choice
carrying text takes. A tool-call or reasoning parser that holds text back, the detokenizer holding
back a partial word, and an EOS with no text all leave ids pending; the finish-reason chunk takes
whatever is left, so the streamed ids, concatenated, are the non-streamed ``output_ids``.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import json
from dataclasses import dataclass, field
from typing import Any, AsyncIterator, Callable

from toolkit.patches.common.env import env_flag
from toolkit.patches.common.serialize import omit_when_none

# What the patched SGLang files call (add_to_response, omit_when_none, stream_token_ids, tap; omit_when_none
# lives in patches/common and is named here because the patched serializers call it on this module) and
# what the tests read.
__all__ = ["ENV_FLAG", "ChoiceIds", "StreamTokenIds", "add_to_response", "enabled", "incremental_output_ids",
           "omit_when_none", "prompt_ids", "stream_token_ids", "tap"]

ENV_FLAG = "TOOLKIT_RETURN_TOKEN_IDS"

_COMPACT = (",", ":")


def enabled(request: Any) -> bool:
    """Token ids for this request: asked for in the request, or on for the whole server."""
    if getattr(request, "return_token_ids", False) is True:
        return True
    return env_flag(ENV_FLAG)


def prompt_ids(adapted_request: Any, output: dict | None = None) -> list[int] | None:
    """The prompt's token ids: what the serving layer sent to the engine, else what the engine reports.

    SGLang expands a request with ``n > 1`` into a batch of identical prompts in place, so a list
    of lists stands for one prompt.
    """
    ids = getattr(adapted_request, "input_ids", None)
    if ids is None and output is not None:
        ids = output.get("prompt_token_ids")
    if ids is None or isinstance(ids, str):
        return None
    ids = list(ids)
    if ids and isinstance(ids[0], (list, tuple)):
        ids = list(ids[0])
    return [int(token) for token in ids]


# --------------------------------------------------------------------------------------------------
# non-streaming


def add_to_response(response: Any, request: Any, adapted_request: Any, outputs: list[dict]) -> Any:
    """Set ``prompt_token_ids`` and each choice's ``token_ids`` on a built chat response.

    ``outputs`` are the engine's results in choice order; anything that is not a response (an error
    response) passes through untouched.
    """
    if not enabled(request) or not hasattr(response, "choices"):
        return response
    response.prompt_token_ids = prompt_ids(adapted_request, outputs[0] if outputs else None)
    for choice in response.choices:
        response_ids = outputs[choice.index].get("output_ids")
        choice.token_ids = [int(token) for token in response_ids] if response_ids is not None else None
    return response


# --------------------------------------------------------------------------------------------------
# streaming


@dataclass
class ChoiceIds:
    """One choice's ids: how many the engine has given (the watermark) and those not yet sent."""

    seen: int = 0
    pending: list[int] = field(default_factory=list)


class StreamTokenIds:
    """Per-stream state: engine outputs in, SSE chunks with token ids out."""

    def __init__(self, *, incremental: bool, prompt_token_ids: list[int] | None) -> None:
        self.incremental = incremental
        self.prompt_token_ids = prompt_token_ids
        self.prompt_sent = False
        self.choices: dict[int, ChoiceIds] = {}

    def observe(self, output: dict) -> None:
        """Record the new ids of one engine output (``{"text", "output_ids", "meta_info", "index"}``)."""
        output_ids = output.get("output_ids")
        if self.prompt_token_ids is None and output.get("prompt_token_ids") is not None:
            self.prompt_token_ids = [int(token) for token in output["prompt_token_ids"]]
        if output_ids is None:
            return
        choice = self.choices.setdefault(output.get("index", 0), ChoiceIds())
        if self.incremental:
            new = list(output_ids)
            # An abort re-sends ids already given; the count of ids so far bounds what is new.
            total = (output.get("meta_info") or {}).get("completion_tokens")
            if isinstance(total, int):
                new = new[: max(total - choice.seen, 0)]
        else:
            # Cumulative: copy past the watermark (SGLang may pass its live list).
            new = list(output_ids[choice.seen :])
        choice.seen += len(new)
        choice.pending.extend(int(token) for token in new)

    def take(self, index: int) -> list[int]:
        choice = self.choices.setdefault(index, ChoiceIds())
        ids, choice.pending = choice.pending, []
        return ids

    def annotate(self, chunk: Any) -> Any:
        """Add the ids a chunk stands for; chunks without choices (usage, errors, [DONE]) pass as they are."""
        located = _sse_json(chunk)
        if located is None:
            return chunk
        start, end, payload = located
        choices = payload.get("choices")
        if not isinstance(choices, list) or not choices:
            return chunk
        top: dict[str, Any] = {}
        if not self.prompt_sent:
            self.prompt_sent = True
            if self.prompt_token_ids is not None:
                top["prompt_token_ids"] = self.prompt_token_ids
        per_choice: list[dict[str, Any]] = []
        for choice in choices:
            added: dict[str, Any] = {}
            if isinstance(choice, dict) and _carries_output(choice):
                added["token_ids"] = self.take(choice.get("index", 0))
            per_choice.append(added)
        if not top and not any(per_choice):
            return chunk
        text = chunk[start:end]
        return chunk[:start] + _with_fields(text, payload, top, per_choice) + chunk[end:]

    async def wrap(self, stream: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """Yield ``stream``'s chunks with ids, publishing this tracker while each step runs so that
        :func:`tap`, called inside the stream, finds it."""
        try:
            while True:
                token = _ACTIVE.set(self)
                try:
                    chunk = await stream.__anext__()
                except StopAsyncIteration:
                    return
                finally:
                    _ACTIVE.reset(token)
                yield self.annotate(chunk)
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


_ACTIVE: contextvars.ContextVar[StreamTokenIds | None] = contextvars.ContextVar(
    "toolkit_token_ids_stream", default=None
)


class _Tap:
    """An engine output iterator that shows every output to the stream's tracker first."""

    def __init__(self, outputs: AsyncIterator[dict], ids: StreamTokenIds) -> None:
        self._outputs = outputs
        self._ids = ids

    def __aiter__(self) -> "_Tap":
        return self

    async def __anext__(self) -> dict:
        output = await self._outputs.__anext__()
        self._ids.observe(output)
        return output

    async def aclose(self) -> None:
        aclose = getattr(self._outputs, "aclose", None)
        if aclose is not None:
            await aclose()


def tap(outputs: AsyncIterator[dict]) -> AsyncIterator[dict]:
    """The engine outputs a chat stream iterates; the same object when no ids are being tracked."""
    ids = _ACTIVE.get()
    return outputs if ids is None else _Tap(outputs, ids)


def incremental_output_ids(serving: Any) -> bool:
    """Whether SGLang streams only the new ``output_ids`` with each output instead of all so far:
    0.5.23 copies ``--incremental-streaming-output`` onto its tokenizer manager, 0.5.9 has
    ``--stream-output`` in its server args."""
    manager = getattr(serving, "tokenizer_manager", None)
    flag = getattr(manager, "incremental_streaming_output", None)
    if flag is None:
        flag = getattr(getattr(manager, "server_args", None), "stream_output", False)
    return bool(flag)


def stream_token_ids(method: Callable) -> Callable:
    """Decorate ``OpenAIServingChat._generate_chat_stream(self, adapted_request, request, ...)``.

    Off for a request, the call returns the method's own generator, untouched.
    """
    signature = inspect.signature(method)

    @functools.wraps(method)
    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        stream = method(self, *args, **kwargs)
        arguments = signature.bind_partial(self, *args, **kwargs).arguments
        if not enabled(arguments.get("request")):
            return stream
        # Read the prompt now: SGLang expands the request in place once generation starts.
        ids = StreamTokenIds(
            incremental=incremental_output_ids(self),
            prompt_token_ids=prompt_ids(arguments.get("adapted_request")),
        )
        return ids.wrap(stream)

    return generate


# --------------------------------------------------------------------------------------------------
# SSE text


def _carries_output(choice: dict) -> bool:
    if choice.get("finish_reason") is not None:
        return True
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        return False
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("tool_calls"))


def _sse_json(chunk: Any) -> tuple[int, int, dict] | None:
    """Where the JSON object of an SSE event (``data: {...}``, maybe after an ``event:`` line) lies."""
    if not isinstance(chunk, str):
        return None
    if chunk.startswith("data: "):
        start = len("data: ")
    else:
        line = chunk.find("\ndata: ")
        if line < 0:
            return None
        start = line + len("\ndata: ")
    end = chunk.find("\n", start)
    if end < 0:
        end = len(chunk)
    if not chunk.startswith("{", start):
        return None
    try:
        payload = json.loads(chunk[start:end])
    except ValueError:
        return None
    return (start, end, payload) if isinstance(payload, dict) else None


_DECODER = json.JSONDecoder()


def _with_fields(text: str, payload: dict, top: dict, per_choice: list[dict]) -> str:
    """``text`` (the JSON of ``payload``) with fields appended to the object and to its choices.

    Every byte of the original stays as it was; only when the choices cannot be located in the text
    is the object serialized anew.
    """
    key = text.find('"choices":[')
    spans = _element_ends(text, key + len('"choices":[')) if key >= 0 else None
    if spans is None or [value for value, _ in spans] != payload["choices"]:
        merged = dict(payload, **top)
        merged["choices"] = [
            dict(choice, **added) if added else choice for choice, added in zip(payload["choices"], per_choice)
        ]
        return json.dumps(merged, ensure_ascii=False, separators=_COMPACT)
    inserts: list[tuple[int, str]] = []
    for (value, end), added in zip(spans, per_choice):
        if added:  # before the element's closing brace; no comma inside an empty object
            inserts.append((end - 1, _fields(added)[0 if value else 1 :]))
    if top:
        inserts.append((text.rstrip().rfind("}"), _fields(top)))
    for position, fields in sorted(inserts, key=lambda insert: insert[0], reverse=True):
        text = text[:position] + fields + text[position:]
    return text


def _fields(added: dict) -> str:
    return "".join(
        f",{json.dumps(name)}:{json.dumps(value, separators=_COMPACT)}" for name, value in added.items()
    )


def _element_ends(text: str, position: int) -> list[tuple[Any, int]] | None:
    """Decode the array elements starting at ``position`` (just after ``[``): (value, end) each."""
    elements: list[tuple[Any, int]] = []
    length = len(text)
    while True:
        while position < length and text[position] in " \t\r\n":
            position += 1
        if position < length and text[position] == "]" and not elements:
            return elements
        try:
            value, position = _DECODER.raw_decode(text, position)
        except ValueError:
            return None
        if not isinstance(value, dict):
            return None
        elements.append((value, position))
        while position < length and text[position] in " \t\r\n":
            position += 1
        if position >= length:
            return None
        if text[position] == "]":
            return elements
        if text[position] != ",":
            return None
        position += 1
