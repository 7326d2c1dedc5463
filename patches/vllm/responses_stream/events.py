"""The OpenAI Responses items and events of one output item, built from its streaming state.

:mod:`.item_machine` decides what happens (which item opens, what is streamed, when it ends); the
functions here spell it in the ``openai`` package's types: ``output_item.added``, the content part
or argument events in between, and the finished item that ``output_item.done`` carries. Every event
has ``sequence_number=-1``: the serving layer numbers them as it sends them.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from typing import Any, Sequence

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


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass
class OpenItem:
    """The output item being streamed: what its events have said so far."""

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


def item_done_event(item: OpenItem, done: Any) -> Event:
    return ResponseOutputItemDoneEvent(
        type="response.output_item.done", sequence_number=-1, output_index=item.index, item=done,
    )


# -- messages and reasoning: one content part each -----------------------------------------------


def open_text_item(kind: str, index: int) -> tuple[OpenItem, list[Event]]:
    """A new ``message`` or ``reasoning`` item at ``index``: its state, ``output_item.added`` and
    ``content_part.added``."""
    events: list[Event] = []
    if kind == "message":
        item = OpenItem("message", new_id("msg"), index, logprobs=[])
        events.append(ResponseOutputItemAddedEvent(
            type="response.output_item.added", sequence_number=-1, output_index=item.index,
            item=ResponseOutputMessage(id=item.id, type="message", role="assistant", content=[],
                                       status="in_progress"),
        ))
        part: Any = ResponseOutputText(type="output_text", text="", annotations=[], logprobs=[])
    else:
        item = OpenItem("reasoning", new_id("rs"), index)
        events.append(ResponseOutputItemAddedEvent(
            type="response.output_item.added", sequence_number=-1, output_index=item.index,
            item=ResponseReasoningItem(id=item.id, type="reasoning", summary=[], status="in_progress"),
        ))
        part = {"type": "reasoning_text", "text": ""}
    events.append(ResponseContentPartAddedEvent(
        type="response.content_part.added", sequence_number=-1, output_index=item.index,
        item_id=item.id, content_index=0, part=part,
    ))
    return item, events


def text_delta(item: OpenItem, delta: str, logprobs: list) -> Event:
    """A text delta of ``item`` (``logprobs``, already in the delta event's type, only on a message)."""
    if item.kind == "reasoning":
        return ResponseReasoningTextDeltaEvent(
            type="response.reasoning_text.delta", sequence_number=-1, output_index=item.index,
            item_id=item.id, content_index=0, delta=delta,
        )
    return ResponseTextDeltaEvent(
        type="response.output_text.delta", sequence_number=-1, output_index=item.index,
        item_id=item.id, content_index=0, delta=delta, logprobs=logprobs,
    )


def text_item_done(item: OpenItem, status: str) -> tuple[Any, list[Event]]:
    """The finished ``message`` / ``reasoning`` item, and the text and content-part done events before
    its ``output_item.done``."""
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
                # a dict: the event's own validation builds the part type of the openai release vLLM installed
                item_id=item.id, content_index=0, part=part.model_dump(),  # type: ignore[arg-type]
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
    return done, events


def stream_logprobs(logprobs: Sequence[Any]) -> list:
    """Output-text logprobs (``response_output_text.Logprob``) as text-delta logprobs."""
    from openai.types.responses import response_text_delta_event as rtde

    out = []
    for lp in logprobs:
        out.append(rtde.Logprob(
            token=lp.token, logprob=lp.logprob,
            top_logprobs=[rtde.LogprobTopLogprob(token=t.token, logprob=t.logprob) for t in lp.top_logprobs or []],
        ))
    return out


# -- tool calls ----------------------------------------------------------------------------------


def open_call_item(name: str, namespace: str | None, *, custom: bool, call_id: str | None, index: int,
                   key: Any = None) -> tuple[OpenItem, Event]:
    """A new ``function_call`` (or, ``custom``, ``custom_tool_call``) item and its ``output_item.added``."""
    item = OpenItem("custom_tool_call" if custom else "function_call", new_id("ctc" if custom else "fc"),
                    index, name=name, namespace=namespace, call_id=call_id or new_id("call"), key=key)
    added: Any
    if custom:
        added = ResponseCustomToolCall(type="custom_tool_call", id=item.id, call_id=item.call_id,
                                       name=name, input="")
    else:
        added = ResponseFunctionToolCall(type="function_call", id=item.id, call_id=item.call_id, name=name,
                                         namespace=namespace, arguments="", status="in_progress")
    return item, ResponseOutputItemAddedEvent(
        type="response.output_item.added", sequence_number=-1, output_index=item.index, item=added,
    )


def arguments_delta(item: OpenItem, delta: str) -> Event:
    return ResponseFunctionCallArgumentsDeltaEvent(
        type="response.function_call_arguments.delta", sequence_number=-1, output_index=item.index,
        item_id=item.id, delta=delta,
    )


def call_done(item: OpenItem, arguments: str, status: str) -> tuple[Any, list[Event]]:
    """The finished call with ``arguments``, and the events before its ``output_item.done``: the
    arguments done event, or a custom tool's whole input (one delta, then done)."""
    done: Any
    if item.kind == "custom_tool_call":
        payload = custom_input(arguments)
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
            # the openai types have no `name` here; the event keeps it as an extra (openai's models allow extras),
            # and the grammar asks for it (the call's name on its done event)
            item_id=item.id, arguments=arguments, name=item.name,  # type: ignore[call-arg]
        )]
        done = ResponseFunctionToolCall(type="function_call", id=item.id, call_id=item.call_id,
                                        name=item.name, namespace=item.namespace, arguments=arguments,
                                        status=status)  # type: ignore[arg-type]
    return done, events


def custom_input(arguments: str) -> str:
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
