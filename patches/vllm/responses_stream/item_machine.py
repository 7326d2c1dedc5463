"""Layer 2 of the Responses streaming state machine: ordered pieces to output items and their events.

:class:`ItemMachine` takes the pieces :mod:`.segmenter` cuts (or a parser's typed deltas) and makes
items of them. Items never overlap; each one is ``output_item.added`` ... ``output_item.done``;
whitespace alone never opens an item, and (with ``trim``) whitespace at an item's edges belongs to no
item. A marker-delimited tool call streams its arguments as they come when its JSON body names the
function first; otherwise it is decoded at its end marker, and a body no one can decode is text after
all (or nothing, if the output ended inside it). :mod:`.events` spells the items and events in the
``openai`` package's types.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from toolkit.patches.vllm.responses_stream.events import (
    Event,
    OpenItem,
    arguments_delta,
    call_done,
    item_done_event,
    open_call_item,
    open_text_item,
    stream_logprobs,
    text_delta,
    text_item_done,
)
from toolkit.patches.vllm.responses_stream.segmenter import Markers

NameResolver = Callable[[str], "tuple[str, str | None]"]
ToolDecoder = Callable[[str], "list[tuple[str, str]] | None"]

# -- JSON tool-call bodies -----------------------------------------------------------------------

# A body that names the function before its arguments: they can be streamed as they come.
_NAME_FIRST = re.compile(
    r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"(?:arguments|parameters)"\s*:\s*(?=\S)', re.DOTALL
)


def _strip_outer_close(raw: str) -> str:
    """``raw`` without trailing whitespace, one ``}`` (the call object's own) and whitespace."""
    end = len(raw.rstrip())
    if end and raw[end - 1] == "}":
        end = len(raw[: end - 1].rstrip())
    return raw[:end]


def decode_json_call(body: str) -> tuple[str, Any] | None:
    """``{"name": ..., "arguments": ...}`` -> (name, arguments object), or None."""
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return obj["name"], args


def _json_equal(text: str, value: Any) -> bool:
    try:
        return json.loads(text) == value
    except ValueError:
        return False


def _valid_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


# -- the machine ---------------------------------------------------------------------------------


@dataclass
class _Region:
    """A marker-delimited tool call being read."""

    body: str = ""
    args_start: int = -1  # where the streamed arguments begin in ``body`` (JSON, name first)
    item: OpenItem | None = None
    dropped: bool = False  # parallel_tool_calls=False and a call was already made


class ItemMachine:
    """Ordered pieces -> output items and their OpenAI events. See the module docstring."""

    def __init__(
        self,
        *,
        markers: Markers = Markers(),
        include_reasoning: bool = True,
        trim: bool = True,
        resolve_name: NameResolver | None = None,
        custom_tool_names: Iterable[str] = (),
        decode_tool: ToolDecoder | None = None,
        parallel_tool_calls: bool = True,
    ) -> None:
        self.markers = markers
        self.include_reasoning = include_reasoning
        self.trim = trim
        self.resolve_name = resolve_name or (lambda name: (name, None))
        self.custom_tool_names = frozenset(custom_tool_names)
        self.decode_tool = decode_tool
        self.parallel_tool_calls = parallel_tool_calls
        self.items: list[Any] = []  # the finished items, exactly as sent in output_item.done
        self._open: OpenItem | None = None
        self._run_kind: str | None = None  # text-like run whose item is not open yet
        self._lead = ""  # whitespace of that run
        self._region: _Region | None = None
        self._pending_logprobs: list = []
        self._calls = 0
        self.finished = False

    # -- logprobs waiting for the next text delta -------------------------------------------------

    def hold_logprobs(self, logprobs: Sequence[Any]) -> None:
        """``logprobs`` go on the next text delta this machine emits (replacing any still held)."""
        self._pending_logprobs = list(logprobs)

    def drop_held_logprobs(self) -> None:
        """Logprobs no text delta took (the text they belonged to was markup) are not carried on."""
        self._pending_logprobs = []

    # -- text-like items -------------------------------------------------------------------------

    def text(self, text: str, logprobs: Sequence[Any] | None = None) -> list[Event]:
        if logprobs:
            self._pending_logprobs.extend(logprobs)
        return self._text_like("message", text)

    def reasoning(self, text: str) -> list[Event]:
        if not self.include_reasoning:
            return []
        return self._text_like("reasoning", text)

    def _text_like(self, kind: str, text: str) -> list[Event]:
        if not text:
            return []
        events: list[Event] = []
        item = self._open
        if item is not None and item.kind != kind:
            events += self._close_open()
            item = None
        if item is None:
            if self._run_kind != kind:
                self._run_kind, self._lead = kind, ""
            text = self._lead + text
            if not text.strip():
                self._lead = text
                return events
            self._lead, self._run_kind = "", None
            if self.trim:
                text = text.lstrip()
            item = self._open_text_item(kind, events)
        data = item.tail + text
        if self.trim:
            body = data.rstrip()
            item.tail = data[len(body):]
        else:
            body, item.tail = data, ""
        if body:
            item.text += body
            events.append(self._text_delta(item, body))
        return events

    def boundary(self) -> list[Event]:
        """An item boundary in the output (e.g. end of a reasoning block)."""
        self._run_kind, self._lead = None, ""
        if self._open is not None and self._open.kind in ("message", "reasoning"):
            return self._close_open()
        return []

    def _open_text_item(self, kind: str, events: list[Event]) -> OpenItem:
        item, added = open_text_item(kind, len(self.items))
        events += added
        self._open = item
        return item

    def _text_delta(self, item: OpenItem, delta: str) -> Event:
        logprobs: list = []
        if item.kind == "message" and self._pending_logprobs:  # reasoning text carries no logprobs
            item.logprobs.extend(self._pending_logprobs)  # type: ignore[union-attr]
            logprobs, self._pending_logprobs = stream_logprobs(self._pending_logprobs), []
        return text_delta(item, delta, logprobs)

    def _close_text_item(self, item: OpenItem, status: str) -> list[Event]:
        done, events = text_item_done(item, status)
        events.append(self._item_done(item, done))
        return events

    def _item_done(self, item: OpenItem, done: Any) -> Event:
        self.items.append(done)
        self._open = None
        return item_done_event(item, done)

    def _close_open(self, status: str = "completed") -> list[Event]:
        item = self._open
        if item is None:
            return []
        if item.kind in ("message", "reasoning"):
            return self._close_text_item(item, status)
        return self._close_call(item, item.text, status)

    # -- tool calls ------------------------------------------------------------------------------

    def _open_call(self, name: str, call_id: str | None, events: list[Event], key: Any = None) -> OpenItem:
        name, namespace = self.resolve_name(name)
        item, added = open_call_item(name, namespace, custom=name in self.custom_tool_names, call_id=call_id,
                                     index=len(self.items), key=key)
        events.append(added)
        self._open = item
        self._calls += 1
        return item

    def _call_delta(self, item: OpenItem, delta: str) -> list[Event]:
        if not delta:
            return []
        item.text += delta
        if item.kind == "custom_tool_call":
            return []  # a custom tool's input is known only once its arguments are complete
        return [arguments_delta(item, delta)]

    def _close_call(self, item: OpenItem, arguments: str, status: str = "completed") -> list[Event]:
        done, events = call_done(item, arguments, status)
        events.append(self._item_done(item, done))
        return events

    def _whole_call(self, name: str, arguments: str, events: list[Event]) -> None:
        if not self.parallel_tool_calls and self._calls:
            return
        item = self._open_call(name, None, events)
        events += self._call_delta(item, arguments)
        events += self._close_call(item, arguments)

    # marker-delimited tool calls

    def tool_open(self) -> list[Event]:
        events = self.boundary()
        events += self._close_open()
        self._region = _Region(dropped=not self.parallel_tool_calls and self._calls > 0)
        return events

    def tool_body(self, text: str) -> list[Event]:
        region = self._region
        if region is None or region.dropped or not text:
            return []
        region.body += text
        events: list[Event] = []
        if region.item is None and region.args_start < 0:
            match = _NAME_FIRST.match(region.body)
            if match is not None:
                try:
                    name = json.loads(f'"{match.group(1)}"')
                except ValueError:
                    name = ""
                if name and self.resolve_name(name)[0] not in self.custom_tool_names:
                    region.args_start = match.end()
                    region.item = self._open_call(name, None, events)
                else:
                    region.args_start = len(region.body) + 1  # decided: not streamed; decode at close
        if region.item is not None:
            emittable = _strip_outer_close(region.body[region.args_start:])
            if len(emittable) > len(region.item.text):
                events += self._call_delta(region.item, emittable[len(region.item.text):])
        return events

    def tool_close(self, cut: bool = False) -> list[Event]:
        region, self._region = self._region, None
        if region is None or region.dropped:
            return []
        events: list[Event] = []
        item = region.item
        if item is not None:
            raw = region.body[region.args_start:]
            # The arguments end before the call object's own "}" -- or at the end, if it never came.
            tight, loose = _strip_outer_close(raw), raw.rstrip()
            decoded = decode_json_call(region.body)
            status = "completed"
            if decoded is not None:
                final = next((c for c in (tight, loose) if _json_equal(c, decoded[1])), None)
                if final is None:  # e.g. keys after "arguments": the canonical form wins (deltas differ)
                    final = json.dumps(decoded[1], ensure_ascii=False)
            else:
                final = next((c for c in (tight, loose) if _valid_json(c)), None)
                if final is None:
                    final, status = item.text, "incomplete"
            if final.startswith(item.text):
                events += self._call_delta(item, final[len(item.text):])
            return events + self._close_call(item, final, status)
        calls = self._decode_region(region.body)
        if calls:
            for name, arguments in calls:
                self._whole_call(name, arguments, events)
            return events
        if cut:
            return events  # a cut, undecodable call is neither a call nor text
        # Not a tool call after all: what the model wrote is text.
        raw = f"{self.markers.tool_start or ''}{region.body}{self.markers.tool_end or ''}"
        return events + self._text_like("message", raw)

    def _decode_region(self, body: str) -> list[tuple[str, str]] | None:
        decoded = decode_json_call(body)
        if decoded is not None:
            return [(decoded[0], json.dumps(decoded[1], ensure_ascii=False))]
        if self.decode_tool is not None:
            try:
                return self.decode_tool(body) or None
            except Exception:  # a parser that cannot read it: the caller treats it as text
                return None
        return None

    # parser-delimited tool calls (typed deltas from a vLLM parser, no markers)

    def tool_delta(self, key: Any, call_id: str | None, name: str | None, arguments: str | None) -> list[Event]:
        events: list[Event] = []
        item = self._open
        is_call = item is not None and item.kind in ("function_call", "custom_tool_call")
        continues = is_call and key is not None and item.key == key  # type: ignore[union-attr]
        if name and not continues:
            events += self.boundary()
            events += self._close_open()
            if not self.parallel_tool_calls and self._calls:
                return events  # only the first call is kept; its later deltas find no open call
            item = self._open_call(name, call_id, events, key=key)
        elif not is_call or (key is not None and item.key is not None and item.key != key):  # type: ignore[union-attr]
            return events  # arguments of a call that is not open (dropped, or never named)
        if arguments:
            events += self._call_delta(item, arguments)  # type: ignore[arg-type]
        return events

    # -- end -------------------------------------------------------------------------------------

    def finish(self, finish_reason: str | None) -> list[Event]:
        if self.finished:
            return []
        self.finished = True
        cut = finish_reason in ("length", "abort", "error")
        events: list[Event] = []
        if self._region is not None:
            events += self.tool_close(cut=True)
        if self._open is not None:
            events += self._close_open("incomplete" if cut else "completed")
        return events

