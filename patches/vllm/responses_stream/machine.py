"""The Responses-API streaming state machine: model output in, OpenAI Responses events out.

Engine-independent (it needs only the ``openai`` package's event types). Two layers:

* :class:`Segmenter` cuts raw model text, delivered in any chunking, into ordered pieces --
  reasoning, text, tool-call bodies -- at the markers of the configured parsers (``<think>``,
  ``</think>``, ``<tool_call>``, ``</tool_call>`` ...). It holds back only a suffix that could be the
  start of a marker, so markup never leaks out as text and nothing else is delayed.
* :class:`ItemMachine` turns ordered pieces into output items and their events. Items never overlap;
  each one is ``output_item.added`` ... ``output_item.done``; whitespace alone never opens an item.

:class:`ResponsesStream` puts the two together. Feeding the whole output at once gives the same items
(ids aside) as feeding it token by token, which is how the non-streaming response is made equal to the
streamed one.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

from openai.types.responses import (
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCustomToolCall,
    ResponseCustomToolCallInputDeltaEvent,
    ResponseCustomToolCallInputDoneEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseFunctionToolCall,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
    ResponseReasoningTextDeltaEvent,
    ResponseReasoningTextDoneEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)
from openai.types.responses.response_reasoning_item import Content as ReasoningTextContent

Event = Any  # an openai ``Response*Event`` model
NameResolver = Callable[[str], "tuple[str, str | None]"]
ToolDecoder = Callable[[str], "list[tuple[str, str]] | None"]

TEXT, REASONING, TOOL = "text", "reasoning", "tool"
# control pieces from the segmenter
REASONING_END, TOOL_OPEN, TOOL_CLOSE, TOOL_CUT = "reasoning_end", "tool_open", "tool_close", "tool_cut"


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class Markers:
    """The literal strings that open and close reasoning and tool calls (None: not parsed)."""

    reasoning_start: str | None = None
    reasoning_end: str | None = None
    tool_start: str | None = None
    tool_end: str | None = None

    @property
    def reasoning(self) -> bool:
        return bool(self.reasoning_start and self.reasoning_end)

    @property
    def tools(self) -> bool:
        return bool(self.tool_start and self.tool_end)


# ------------------------------------------------------------------------------------------------
# layer 1: raw text -> ordered pieces


class Segmenter:
    """Split raw model text into ordered ``(kind, text)`` pieces, whatever the chunking.

    Kinds: ``text``, ``reasoning``, ``tool`` (a tool-call body) and the controls ``reasoning_end``,
    ``tool_open``, ``tool_close`` and (at end of output inside a tool call) ``tool_cut``.
    Reasoning may open anywhere text may (interleaved thinking); a stray reasoning end marker in
    text, or a start marker inside reasoning (a model that writes ``<think>`` although the prompt
    already opened reasoning), is dropped. Inside a tool call only the tool end marker counts.
    """

    def __init__(self, markers: Markers, *, start_in_reasoning: bool = False) -> None:
        self.markers = markers
        # state -> [(marker, control, next state)]
        table: dict[str, list[tuple[str, str | None, str]]] = {TEXT: [], REASONING: [], TOOL: []}
        if markers.reasoning:
            table[TEXT].append((markers.reasoning_start, None, REASONING))  # type: ignore[arg-type]
            table[TEXT].append((markers.reasoning_end, None, TEXT))  # type: ignore[arg-type]
            table[REASONING].append((markers.reasoning_end, REASONING_END, TEXT))  # type: ignore[arg-type]
            table[REASONING].append((markers.reasoning_start, None, REASONING))  # type: ignore[arg-type]
        if markers.tools:
            table[TEXT].append((markers.tool_start, TOOL_OPEN, TOOL))  # type: ignore[arg-type]
            table[TOOL].append((markers.tool_end, TOOL_CLOSE, TEXT))  # type: ignore[arg-type]
        self._table = table
        self._firsts = {state: frozenset(m[0][0] for m in entries) for state, entries in table.items()}
        self._longest = {state: max((len(m[0]) for m in entries), default=0) for state, entries in table.items()}
        self.state = REASONING if (start_in_reasoning and markers.reasoning) else TEXT
        self._buf = ""

    def feed(self, text: str) -> list[tuple[str, str]]:
        if not text:
            return []
        pieces: list[tuple[str, str]] = []
        buf = self._buf + text
        while True:
            entries = self._table[self.state]
            best: tuple[int, str, str | None, str] | None = None
            for marker, control, nxt in entries:
                at = buf.find(marker)
                if at != -1 and (best is None or at < best[0] or (at == best[0] and len(marker) > len(best[1]))):
                    best = (at, marker, control, nxt)
            if best is None:
                break
            at, marker, control, nxt = best
            if at:
                pieces.append((self.state, buf[:at]))
            buf = buf[at + len(marker):]
            if control is not None:
                pieces.append((control, ""))
            self.state = nxt
        hold = self._holdback(buf)
        if len(buf) > hold:
            pieces.append((self.state, buf[: len(buf) - hold]))
            buf = buf[len(buf) - hold:]
        self._buf = buf
        return pieces

    def _holdback(self, buf: str) -> int:
        """Length of the longest suffix of ``buf`` that is a proper prefix of a live marker."""
        longest = self._longest[self.state]
        if not longest or not buf:
            return 0
        firsts = self._firsts[self.state]
        tail = buf[-(longest - 1):] if longest > 1 else ""
        if not any(c in firsts for c in tail):
            return 0
        markers = [m[0] for m in self._table[self.state]]
        for k in range(min(len(buf), longest - 1), 0, -1):
            suffix = buf[-k:]
            if any(m.startswith(suffix) for m in markers):
                return k
        return 0

    def finish(self) -> list[tuple[str, str]]:
        """End of output: what was held back is plain content of the current state."""
        pieces: list[tuple[str, str]] = []
        if self._buf:
            pieces.append((self.state, self._buf))
            self._buf = ""
        if self.state == TOOL:
            pieces.append((TOOL_CUT, ""))
        return pieces


# ------------------------------------------------------------------------------------------------
# layer 2: ordered pieces -> items and events

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


@dataclass
class _Item:
    kind: str  # "message" | "reasoning" | "function_call" | "custom_tool_call"
    id: str
    index: int
    text: str = ""  # message / reasoning text, or arguments streamed so far
    tail: str = ""  # trailing whitespace held back (text items)
    name: str = ""
    namespace: str | None = None
    call_id: str = ""
    key: Any = None  # parser tool-call index (typed-delta path)
    logprobs: list | None = None


@dataclass
class _Region:
    """A marker-delimited tool call being read."""

    body: str = ""
    args_start: int = -1  # where the streamed arguments begin in ``body`` (JSON, name first)
    item: _Item | None = None
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
        self._open: _Item | None = None
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

    def _open_text_item(self, kind: str, events: list[Event]) -> _Item:
        if kind == "message":
            item = _Item("message", new_id("msg"), len(self.items), logprobs=[])
            events.append(ResponseOutputItemAddedEvent(
                type="response.output_item.added", sequence_number=-1, output_index=item.index,
                item=ResponseOutputMessage(id=item.id, type="message", role="assistant", content=[],
                                           status="in_progress"),
            ))
            part: Any = ResponseOutputText(type="output_text", text="", annotations=[], logprobs=[])
        else:
            item = _Item("reasoning", new_id("rs"), len(self.items))
            events.append(ResponseOutputItemAddedEvent(
                type="response.output_item.added", sequence_number=-1, output_index=item.index,
                item=ResponseReasoningItem(id=item.id, type="reasoning", summary=[], status="in_progress"),
            ))
            part = {"type": "reasoning_text", "text": ""}
        events.append(ResponseContentPartAddedEvent(
            type="response.content_part.added", sequence_number=-1, output_index=item.index,
            item_id=item.id, content_index=0, part=part,
        ))
        self._open = item
        return item

    def _text_delta(self, item: _Item, delta: str) -> Event:
        if item.kind == "reasoning":
            return ResponseReasoningTextDeltaEvent(
                type="response.reasoning_text.delta", sequence_number=-1, output_index=item.index,
                item_id=item.id, content_index=0, delta=delta,
            )
        logprobs: list = []
        if self._pending_logprobs:
            item.logprobs.extend(self._pending_logprobs)  # type: ignore[union-attr]
            logprobs, self._pending_logprobs = _stream_logprobs(self._pending_logprobs), []
        return ResponseTextDeltaEvent(
            type="response.output_text.delta", sequence_number=-1, output_index=item.index,
            item_id=item.id, content_index=0, delta=delta, logprobs=logprobs,
        )

    def _close_text_item(self, item: _Item, status: str) -> list[Event]:
        if item.kind == "reasoning":
            part = ReasoningTextContent(type="reasoning_text", text=item.text)
            done: Any = ResponseReasoningItem(id=item.id, type="reasoning", summary=[], content=[part],
                                              status=status)  # type: ignore[arg-type]
            events: list[Event] = [
                ResponseReasoningTextDoneEvent(
                    type="response.reasoning_text.done", sequence_number=-1, output_index=item.index,
                    item_id=item.id, content_index=0, text=item.text,
                ),
                ResponseContentPartDoneEvent(
                    type="response.content_part.done", sequence_number=-1, output_index=item.index,
                    item_id=item.id, content_index=0, part=part.model_dump(),
                ),
            ]
        else:
            text_part = ResponseOutputText(type="output_text", text=item.text, annotations=[],
                                           logprobs=item.logprobs or None)
            done = ResponseOutputMessage(id=item.id, type="message", role="assistant", content=[text_part],
                                         status=status)  # type: ignore[arg-type]
            events = [
                ResponseTextDoneEvent(
                    type="response.output_text.done", sequence_number=-1, output_index=item.index,
                    item_id=item.id, content_index=0, text=item.text, logprobs=[],
                ),
                ResponseContentPartDoneEvent(
                    type="response.content_part.done", sequence_number=-1, output_index=item.index,
                    item_id=item.id, content_index=0, part=text_part,
                ),
            ]
        events.append(self._item_done(item, done))
        return events

    def _item_done(self, item: _Item, done: Any) -> Event:
        self.items.append(done)
        self._open = None
        return ResponseOutputItemDoneEvent(
            type="response.output_item.done", sequence_number=-1, output_index=item.index, item=done,
        )

    def _close_open(self, status: str = "completed") -> list[Event]:
        item = self._open
        if item is None:
            return []
        if item.kind in ("message", "reasoning"):
            return self._close_text_item(item, status)
        return self._close_call(item, item.text, status)

    # -- tool calls ------------------------------------------------------------------------------

    def _open_call(self, name: str, call_id: str | None, events: list[Event], key: Any = None) -> _Item:
        name, namespace = self.resolve_name(name)
        custom = name in self.custom_tool_names
        item = _Item("custom_tool_call" if custom else "function_call", new_id("ctc" if custom else "fc"),
                     len(self.items), name=name, namespace=namespace, call_id=call_id or new_id("call"), key=key)
        added: Any
        if custom:
            added = ResponseCustomToolCall(type="custom_tool_call", id=item.id, call_id=item.call_id,
                                           name=name, input="")
        else:
            added = ResponseFunctionToolCall(type="function_call", id=item.id, call_id=item.call_id, name=name,
                                             namespace=namespace, arguments="", status="in_progress")
        events.append(ResponseOutputItemAddedEvent(
            type="response.output_item.added", sequence_number=-1, output_index=item.index, item=added,
        ))
        self._open = item
        self._calls += 1
        return item

    def _call_delta(self, item: _Item, delta: str) -> list[Event]:
        if not delta:
            return []
        item.text += delta
        if item.kind == "custom_tool_call":
            return []  # a custom tool's input is known only once its arguments are complete
        return [ResponseFunctionCallArgumentsDeltaEvent(
            type="response.function_call_arguments.delta", sequence_number=-1, output_index=item.index,
            item_id=item.id, delta=delta,
        )]

    def _close_call(self, item: _Item, arguments: str, status: str = "completed") -> list[Event]:
        done: Any
        if item.kind == "custom_tool_call":
            payload = _custom_input(arguments)
            events: list[Event] = []
            if payload:
                events.append(ResponseCustomToolCallInputDeltaEvent(
                    type="response.custom_tool_call_input.delta", sequence_number=-1, output_index=item.index,
                    item_id=item.id, delta=payload,
                ))
            events.append(ResponseCustomToolCallInputDoneEvent(
                type="response.custom_tool_call_input.done", sequence_number=-1, output_index=item.index,
                item_id=item.id, input=payload,
            ))
            done = ResponseCustomToolCall(type="custom_tool_call", id=item.id, call_id=item.call_id,
                                          name=item.name, input=payload)
        else:
            events = [ResponseFunctionCallArgumentsDoneEvent(
                type="response.function_call_arguments.done", sequence_number=-1, output_index=item.index,
                item_id=item.id, arguments=arguments, name=item.name,
            )]
            done = ResponseFunctionToolCall(type="function_call", id=item.id, call_id=item.call_id,
                                            name=item.name, namespace=item.namespace, arguments=arguments,
                                            status=status)  # type: ignore[arg-type]
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


def _valid_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def _custom_input(arguments: str) -> str:
    """A custom tool's input from what the parser gave: a JSON object with one string, or the text."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1 and isinstance(next(iter(value.values())), str):
        return next(iter(value.values()))
    return arguments


def _stream_logprobs(logprobs: Sequence[Any]) -> list:
    """Output-text logprobs (``response_output_text.Logprob``) as text-delta logprobs."""
    from openai.types.responses import response_text_delta_event as rtde

    out = []
    for lp in logprobs:
        out.append(rtde.Logprob(
            token=lp.token, logprob=lp.logprob,
            top_logprobs=[rtde.LogprobTopLogprob(token=t.token, logprob=t.logprob) for t in lp.top_logprobs or []],
        ))
    return out


# ------------------------------------------------------------------------------------------------
# the two together


class ResponsesStream:
    """One response's output: feed model text (or parsed deltas), then ``finish``; read ``items``."""

    def __init__(
        self,
        markers: Markers | None = None,
        *,
        start_in_reasoning: bool = False,
        include_reasoning: bool = True,
        trim: bool | None = None,
        resolve_name: NameResolver | None = None,
        custom_tool_names: Iterable[str] = (),
        decode_tool: ToolDecoder | None = None,
        parallel_tool_calls: bool = True,
    ) -> None:
        markers = markers or Markers()
        self.segmenter = Segmenter(markers, start_in_reasoning=start_in_reasoning)
        self.machine = ItemMachine(
            markers=markers,
            include_reasoning=include_reasoning,
            trim=(markers.reasoning or markers.tools) if trim is None else trim,
            resolve_name=resolve_name,
            custom_tool_names=custom_tool_names,
            decode_tool=decode_tool,
            parallel_tool_calls=parallel_tool_calls,
        )

    @property
    def items(self) -> list[Any]:
        return self.machine.items

    def feed(self, text: str, logprobs: Sequence[Any] | None = None) -> list[Event]:
        """Raw model text (a delta, or the whole output), split at the markers.

        ``logprobs`` (of this text's tokens) go on the first text delta this feed produces, if any.
        """
        machine = self.machine
        if logprobs:
            machine.hold_logprobs(logprobs)
        events = self._pieces(self.segmenter.feed(text))
        machine.drop_held_logprobs()
        return events

    def feed_parsed(
        self,
        reasoning: str | None = None,
        content: str | None = None,
        tool_calls: Sequence[Any] | None = None,
        logprobs: Sequence[Any] | None = None,
    ) -> list[Event]:
        """Already-parsed output (a parser's delta, or its whole result): reasoning, text, calls.

        ``tool_calls`` items have ``index``, ``id`` and ``function.name`` / ``function.arguments``
        (vLLM's ``DeltaToolCall``) or ``name`` / ``arguments`` (``FunctionCall``).
        """
        machine = self.machine
        events: list[Event] = []
        if reasoning:
            events += machine.reasoning(reasoning)
        if content:
            events += machine.text(content, logprobs)
            machine.drop_held_logprobs()
        for call in tool_calls or ():
            function = getattr(call, "function", None)
            holder = function if function is not None else call
            name = getattr(holder, "name", None)
            arguments = getattr(holder, "arguments", None)
            events += machine.tool_delta(getattr(call, "index", None), getattr(call, "id", None), name, arguments)
        return events

    def _pieces(self, pieces: list[tuple[str, str]]) -> list[Event]:
        machine = self.machine
        events: list[Event] = []
        for kind, text in pieces:
            if kind == TEXT:
                events += machine.text(text)
            elif kind == REASONING:
                events += machine.reasoning(text)
            elif kind == TOOL:
                events += machine.tool_body(text)
            elif kind == REASONING_END:
                events += machine.boundary()
            elif kind == TOOL_OPEN:
                events += machine.tool_open()
            elif kind == TOOL_CLOSE:
                events += machine.tool_close()
            elif kind == TOOL_CUT:
                events += machine.tool_close(cut=True)
        return events

    def finish(self, finish_reason: str | None = None) -> list[Event]:
        events = self._pieces(self.segmenter.finish())
        return events + self.machine.finish(finish_reason)
