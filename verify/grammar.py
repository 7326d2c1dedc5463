"""A checker for the OpenAI Responses streaming event grammar, independent of any engine.

``check_events(events) -> list[str]`` runs a state machine over one response's events (dicts as
parsed from the SSE ``data:`` lines, or pydantic models) and returns every problem it finds, each a
sentence naming the event (its position in the stream and its type). An empty list means:

* ``response.created``, ``response.in_progress``, the output items, then exactly one terminal event
  (``response.completed``, ``response.incomplete`` with its reason, or ``response.failed`` with its
  error) and nothing after it; ``sequence_number`` is 0, 1, 2, ... with no gap.
* Items never overlap; each is ``output_item.added`` (status ``in_progress``) ... its events ...
  ``output_item.done``; ``output_index`` counts the items; ids are unique and consistent.
* A message has content parts, each ``content_part.added``, ``output_text.delta``*,
  ``output_text.done`` (the deltas joined), ``content_part.done``; a reasoning item the same with
  ``reasoning_text``; a function call ``function_call_arguments.delta``* then always
  ``function_call_arguments.done`` with its ``name`` and the joined arguments; a custom tool call
  ``custom_tool_call_input.delta``* then ``custom_tool_call_input.done``.
* The done item carries exactly what was streamed (text, arguments, name, call_id); it is
  ``completed``, or ``incomplete`` only when it is the last item. No message or reasoning item is
  empty or whitespace only.
* The terminal response's ``output`` is exactly the done items (same ids, same content), and the
  response id and status agree with the lifecycle events.

``parse_sse`` turns an SSE body into the list of event dicts; ``compare_outputs`` compares two
``output`` lists item by item (optionally ignoring ids), e.g. a stream's final response with the
non-streaming response to the same greedy request.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from toolkit.base.sse import parse_sse

# parse_sse is re-exported: tests and scripts read streams with it
__all__ = ["as_dict", "check_events", "compare_outputs", "parse_sse"]

TERMINAL = {"response.completed": "completed", "response.incomplete": "incomplete", "response.failed": "failed"}
ITEM_TYPES = ("message", "reasoning", "function_call", "custom_tool_call")
TEXT_EVENTS = {
    # item type -> (part type, delta event, done event)
    "message": ("output_text", "response.output_text.delta", "response.output_text.done"),
    "reasoning": ("reasoning_text", "response.reasoning_text.delta", "response.reasoning_text.done"),
}
ID_KEYS = ("id", "call_id")


def as_dict(event: Any) -> dict:
    if isinstance(event, Mapping):
        return dict(event)
    dump = getattr(event, "model_dump", None)
    if dump is not None:
        return dump(mode="json", by_alias=True)
    raise TypeError(f"not an event: {event!r}")


class _Checker:
    def __init__(self) -> None:
        self.problems: list[str] = []
        self.phase = "start"  # start -> created -> items -> terminal
        self.response_id: str | None = None
        self.item: dict | None = None  # the open item's state
        self.done_items: list[dict] = []
        self.ids: set[str] = set()
        self.where = ""

    def problem(self, text: str) -> None:
        self.problems.append(f"{self.where}: {text}")

    # ------------------------------------------------------------------------------------------

    def run(self, events: Sequence[Any]) -> list[str]:
        for position, raw in enumerate(events):
            try:
                event = as_dict(raw)
            except TypeError as exc:
                self.where = f"event {position}"
                self.problem(str(exc))
                continue
            kind = event.get("type")
            self.where = f"event {position} ({kind})"
            if event.get("sequence_number") != position:
                self.problem(f"sequence_number is {event.get('sequence_number')!r}, expected {position}")
            if self.phase == "terminal":
                self.problem("event after the terminal event")
                continue
            self.step(kind, event)
        self.where = "end of stream"
        if self.phase != "terminal":
            if self.item is not None:
                self.problem(f"item {self.item['index']} ({self.item['type']}) was never done")
            self.problem("no terminal event (response.completed, response.incomplete or response.failed)")
        return self.problems

    def step(self, kind: Any, event: dict) -> None:
        if self.phase == "start":
            if kind != "response.created":
                self.problem("the stream must begin with response.created")
            self.phase = "created"
            self._lifecycle(event, "in_progress", first=True)
            return
        if self.phase == "created":
            if kind != "response.in_progress":
                self.problem("response.in_progress must follow response.created")
                self.phase = "items"
                self.step(kind, event)
                return
            self.phase = "items"
            self._lifecycle(event, "in_progress")
            return
        if kind in TERMINAL:
            self._terminal(kind, event)
            return
        if kind == "response.output_item.added":
            self._added(event)
        elif kind == "response.output_item.done":
            self._done(event)
        elif self.item is None:
            self.problem("event outside any output item")
        else:
            self._inside(kind, event)

    # -- lifecycle -------------------------------------------------------------------------------

    def _lifecycle(self, event: dict, status: str, first: bool = False) -> None:
        response = event.get("response")
        if not isinstance(response, Mapping):
            self.problem("has no response object")
            return
        if first:
            self.response_id = response.get("id")
        elif response.get("id") != self.response_id:
            self.problem(f"response id {response.get('id')!r} differs from {self.response_id!r}")
        if response.get("status") != status:
            self.problem(f"response status is {response.get('status')!r}, expected {status!r}")

    def _terminal(self, kind: str, event: dict) -> None:
        self.phase = "terminal"
        if self.item is not None:
            self.problem(f"item {self.item['index']} ({self.item['type']}) is still open")
        self._lifecycle(event, TERMINAL[kind])
        response = event.get("response")
        if not isinstance(response, Mapping):
            return
        if kind == "response.incomplete":
            details = response.get("incomplete_details")
            if not isinstance(details, Mapping) or not details.get("reason"):
                self.problem("response.incomplete without incomplete_details.reason")
        if kind == "response.failed":
            error = response.get("error")
            if not isinstance(error, Mapping) or not error.get("message"):
                self.problem("response.failed without error.message")
        output = response.get("output")
        if kind != "response.failed" or output:
            for difference in compare_outputs(self.done_items, output or [], ignore_ids=False):
                self.problem(f"final output differs from the streamed items: {difference}")
        for item in self.done_items[:-1]:
            if item.get("status") == "incomplete":
                self.problem(f"item {item.get('id')} is incomplete but is not the last item")

    # -- items -----------------------------------------------------------------------------------

    def _added(self, event: dict) -> None:
        if self.item is not None:
            self.problem(f"item {self.item['index']} ({self.item['type']}) is still open: items overlap")
        item = event.get("item")
        if not isinstance(item, Mapping):
            self.problem("has no item")
            return
        index = len(self.done_items)
        if event.get("output_index") != index:
            self.problem(f"output_index is {event.get('output_index')!r}, expected {index}")
        kind = item.get("type")
        if kind not in ITEM_TYPES:
            self.problem(f"unknown item type {kind!r}")
        item_id = item.get("id")
        if not item_id:
            self.problem("item has no id")
        elif item_id in self.ids:
            self.problem(f"item id {item_id} is used twice")
        else:
            self.ids.add(item_id)
        if item.get("status", "in_progress") != "in_progress" and kind != "custom_tool_call":
            self.problem(f"added item status is {item.get('status')!r}, expected 'in_progress'")
        state: dict[str, Any] = {"type": kind, "id": item_id, "index": index, "parts": [], "part": None,
                                 "args": "", "args_done": None, "name": item.get("name"),
                                 "call_id": item.get("call_id")}
        if kind in ("function_call", "custom_tool_call"):
            if not item.get("name"):
                self.problem(f"{kind} added without a name")
            if not item.get("call_id"):
                self.problem(f"{kind} added without a call_id")
        if kind in TEXT_EVENTS and item.get("content"):
            self.problem("a new text item must start with no content")
        self.item = state

    def _own(self, event: dict) -> bool:
        item = self.item
        assert item is not None
        ok = True
        if event.get("output_index") != item["index"]:
            self.problem(f"output_index {event.get('output_index')!r} is not the open item's {item['index']}")
            ok = False
        if event.get("item_id") != item["id"]:
            self.problem(f"item_id {event.get('item_id')!r} is not the open item's {item['id']!r}")
            ok = False
        return ok

    def _inside(self, kind: str, event: dict) -> None:
        item = self.item
        assert item is not None
        self._own(event)
        if item["type"] in TEXT_EVENTS:
            self._text_event(kind, event)
        elif item["type"] == "function_call":
            self._call_event(kind, event, "response.function_call_arguments.delta",
                             "response.function_call_arguments.done", "arguments")
        elif item["type"] == "custom_tool_call":
            self._call_event(kind, event, "response.custom_tool_call_input.delta",
                             "response.custom_tool_call_input.done", "input")
        else:
            self.problem(f"{kind} inside an item of unknown type")

    def _delta(self, kind: str, event: dict, state: dict, joined: str, done: str, done_kind: str) -> None:
        """A text or arguments delta: a string, before ``done_kind``; it joins ``state[joined]``."""
        if state[done] is not None:
            self.problem(f"{kind} after {done_kind}")
        delta = event.get("delta")
        if not isinstance(delta, str):
            self.problem("delta is not a string")
        else:
            state[joined] += delta

    def _text_event(self, kind: str, event: dict) -> None:
        item = self.item
        assert item is not None
        part_type, delta_kind, done_kind = TEXT_EVENTS[item["type"]]
        part = item["part"]
        if kind == "response.content_part.added":
            if part is not None:
                self.problem("content part added while another part is open")
            if event.get("content_index") != len(item["parts"]):
                self.problem(f"content_index is {event.get('content_index')!r}, expected {len(item['parts'])}")
            added = event.get("part") or {}
            if added.get("type") != part_type:
                self.problem(f"part type {added.get('type')!r} in a {item['type']} item, expected {part_type!r}")
            if added.get("text"):
                self.problem("a new content part must start empty")
            item["part"] = {"index": event.get("content_index"), "text": "", "done_text": None}
            return
        if part is None:
            self.problem(f"{kind} with no open content part")
            return
        if event.get("content_index") != part["index"]:
            self.problem(f"content_index {event.get('content_index')!r} is not the open part's {part['index']}")
        if kind == delta_kind:
            self._delta(kind, event, part, "text", "done_text", done_kind)
        elif kind == done_kind:
            if part["done_text"] is not None:
                self.problem(f"{done_kind} twice")
            part["done_text"] = event.get("text")
            if event.get("text") != part["text"]:
                self.problem(f"done text {_short(event.get('text'))} is not the joined deltas {_short(part['text'])}")
        elif kind == "response.content_part.done":
            if part["done_text"] is None:
                self.problem(f"content_part.done before {done_kind}")
            done_part = event.get("part") or {}
            if done_part.get("type") != part_type:
                self.problem(f"done part type {done_part.get('type')!r}, expected {part_type!r}")
            if done_part.get("text") != part["text"]:
                self.problem(f"done part text {_short(done_part.get('text'))} is not the streamed text")
            item["parts"].append(part["text"])
            item["part"] = None
        else:
            self.problem(f"{kind} inside a {item['type']} item")

    def _call_event(self, kind: str, event: dict, delta_kind: str, done_kind: str, field: str) -> None:
        item = self.item
        assert item is not None
        if kind == delta_kind:
            self._delta(kind, event, item, "args", "args_done", done_kind)
        elif kind == done_kind:
            if item["args_done"] is not None:
                self.problem(f"{done_kind} twice")
            value = event.get(field)
            item["args_done"] = value if isinstance(value, str) else ""
            if value != item["args"]:
                self.problem(f"{field} {_short(value)} is not the joined deltas {_short(item['args'])}")
            if kind == "response.function_call_arguments.done" and event.get("name") != item["name"]:
                self.problem(f"name {event.get('name')!r} is not the item's {item['name']!r}")
        else:
            self.problem(f"{kind} inside a {item['type']} item")

    def _done(self, event: dict) -> None:
        state = self.item
        if state is None:
            self.problem("output_item.done with no open item")
            return
        self.item = None
        item = event.get("item")
        if not isinstance(item, Mapping):
            self.problem("has no item")
            return
        if event.get("output_index") != state["index"]:
            self.problem(f"output_index {event.get('output_index')!r} is not the open item's {state['index']}")
        if item.get("id") != state["id"] or item.get("type") != state["type"]:
            self.problem(f"done item {item.get('type')} {item.get('id')} is not the added "
                         f"{state['type']} {state['id']}")
        status = item.get("status", "completed" if state["type"] == "custom_tool_call" else None)
        if status not in ("completed", "incomplete"):
            self.problem(f"done item status is {status!r}, expected 'completed' (or 'incomplete' if cut)")
        if state["type"] in TEXT_EVENTS:
            if state["part"] is not None:
                self.problem("output_item.done while a content part is open")
            texts = [p.get("text") for p in item.get("content") or []]
            if texts != state["parts"]:
                self.problem(f"done item content {texts!r} is not the streamed parts {state['parts']!r}")
            if not state["parts"] or not "".join(state["parts"]).strip():
                self.problem(f"{state['type']} item with no text (empty or whitespace only)")
        else:
            field = "arguments" if state["type"] == "function_call" else "input"
            if state["args_done"] is None:
                self.problem(f"{state['type']} done without {field} done")
            elif item.get(field) != state["args_done"]:
                self.problem(f"done item {field} {_short(item.get(field))} is not {_short(state['args_done'])}")
            for key in ("name", "call_id"):
                if item.get(key) != state[key]:
                    self.problem(f"done item {key} {item.get(key)!r} differs from the added {state[key]!r}")
        self.done_items.append(dict(item))


def check_events(events: Sequence[Any]) -> list[str]:
    """Every grammar problem in one response's stream of events; [] when it is well formed."""
    return _Checker().run(events)


def _without_nulls(value: Any) -> Any:
    # Fields left out and fields set to null mean the same in the API (and clients add typed nulls).
    if isinstance(value, Mapping):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _normal(item: Any, ignore_ids: bool) -> Any:
    item = as_dict(item) if not isinstance(item, Mapping) else dict(item)
    if ignore_ids:
        for key in ID_KEYS:
            item.pop(key, None)
    return _without_nulls(item)


def compare_outputs(first: Sequence[Any], second: Sequence[Any], *, ignore_ids: bool = False) -> list[str]:
    """Item-by-item differences between two ``response.output`` lists ([] when equal)."""
    problems = []
    if len(first) != len(second):
        problems.append(f"{len(first)} items vs {len(second)} items "
                        f"({[as_dict(i).get('type') for i in first]} vs {[as_dict(i).get('type') for i in second]})")
    for index, (a, b) in enumerate(zip(first, second)):
        na, nb = _normal(a, ignore_ids), _normal(b, ignore_ids)
        if na != nb:
            keys = sorted(k for k in set(na) | set(nb) if na.get(k) != nb.get(k))
            detail = ", ".join(f"{k}: {_short(na.get(k))} vs {_short(nb.get(k))}" for k in keys)
            problems.append(f"item {index} ({na.get('type')}) differs: {detail}")
    return problems


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
