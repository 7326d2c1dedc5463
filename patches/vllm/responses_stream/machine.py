"""The Responses-API streaming state machine: model output in, OpenAI Responses events out.

Engine-independent (it needs only the ``openai`` package's event types). Two layers:

* :class:`~.segmenter.Segmenter` (:mod:`.segmenter`) cuts raw model text, delivered in any chunking,
  into ordered pieces -- reasoning, text, tool-call bodies -- at the markers of the configured parsers
  (``<think>``, ``</think>``, ``<tool_call>``, ``</tool_call>`` ...);
* :class:`~.item_machine.ItemMachine` (:mod:`.item_machine`) turns ordered pieces into output items
  and their events (spelled by :mod:`.events`).

:class:`ResponsesStream` puts the two together. Feeding the whole output at once gives the same items
(ids aside) as feeding it token by token, which is how the non-streaming response is made equal to the
streamed one.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from toolkit.patches.vllm.responses_stream.events import Event
from toolkit.patches.vllm.responses_stream.item_machine import ItemMachine, NameResolver, ToolDecoder
from toolkit.patches.vllm.responses_stream.segmenter import (
    REASONING,
    REASONING_END,
    TEXT,
    TOOL,
    TOOL_CLOSE,
    TOOL_CUT,
    TOOL_OPEN,
    Markers,
    Segmenter,
)


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
