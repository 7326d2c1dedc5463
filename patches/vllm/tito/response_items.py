"""Token ids on each output item of a ``/v1/responses`` response (the tito patch on vLLM).

The ids a turn generated are cut into the runs its output items stand for (the reasoning, the
message, each tool call) at the markers the request's reasoning and tool parsers read
(``split_item_ids``, docs/tito.md's rule): ``with_output_item_token_ids`` sets them on the final
response's items, ``with_item_done_token_ids`` on each streamed ``response.output_item.done``. The
patched ``responses/serving.py`` reaches both through ``runtime``, which re-exports them. Plain
Python over duck-typed objects, so it is unit-tested without vLLM.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence


def raw_tokens(messages: Any) -> list[list[int]] | None:
    """The token lists of vLLM's own ``input_messages`` / ``output_messages`` (what it returns with
    ``enable_response_messages``), or None where they are not token records (Harmony's messages)."""
    if not isinstance(messages, list):
        return None
    tokens = [ids for message in messages if isinstance(ids := getattr(message, "tokens", None), (list, tuple))]
    if len(tokens) != len(messages):
        return None
    return [[int(i) for i in ids] for ids in tokens]


class ItemMarkers:
    """How output items are delimited in the generated text: the reasoning parser's end marker
    (``</think>``) and the tool parser's call start and end (``<tool_call>``, ``</tool_call>``), None
    where the parser has none; ``decode`` turns ids into the text the parsers read, and
    ``trailing`` are ids that end a turn (the tokenizer's special ids)."""

    def __init__(self, decode: Any, think_end: str | None = None, call_start: str | None = None,
                 call_end: str | None = None, trailing: Iterable[int] = ()) -> None:
        self.decode = decode
        self.think_end, self.call_start, self.call_end = think_end, call_start, call_end
        self.trailing = frozenset(int(i) for i in trailing)


def item_markers(parser: Any, tokenizer: Any) -> ItemMarkers | None:
    """The markers of a request's response parser (vLLM's ``Parser``, with its reasoning and tool
    parsers) and ``tokenizer``'s decoding; None without a tokenizer."""
    if tokenizer is None:
        return None
    reasoning = getattr(parser, "reasoning_parser", None) or getattr(parser, "_reasoning_parser", None)
    tools = getattr(parser, "tool_parser", None) or getattr(parser, "_tool_parser", None)

    def marker(owner: Any, *names: str) -> str | None:
        for name in names:
            value = getattr(owner, name, None) if owner is not None else None
            if isinstance(value, str) and value:
                return value
        return None

    def decode(ids: list[int]) -> str:
        return tokenizer.decode(ids, skip_special_tokens=True)

    return ItemMarkers(decode, marker(reasoning, "reasoning_end_str", "end_token"),
                       marker(tools, "tool_call_start_token"), marker(tools, "tool_call_end_token"),
                       trailing=getattr(tokenizer, "all_special_ids", None) or ())


class _Positions:
    """Maps a character of the decoded ids to the id that produced it (a binary search over the
    lengths of decoded prefixes, so a marker spelled by several ids is found as well as one id)."""

    def __init__(self, ids: list[int], decode: Any) -> None:
        self.ids, self.decode, self.lengths = ids, decode, {0: 0}

    def length(self, count: int) -> int:
        if count not in self.lengths:
            self.lengths[count] = len(self.decode(self.ids[:count]))
        return self.lengths[count]

    def token_of(self, char: int) -> int:
        """The index of the id whose text holds character ``char``: the fewest ids whose text is
        longer than ``char``, less one."""
        low, high = 0, len(self.ids)
        while low < high:
            middle = (low + high) // 2
            if self.length(middle + 1) > char:
                high = middle
            else:
                low = middle + 1
        return min(low, len(self.ids) - 1)


def _occurrences(text: str, marker: str | None) -> list[int]:
    found, start = [], 0
    while marker:
        start = text.find(marker, start)
        if start < 0:
            break
        found.append(start)
        start += len(marker)
    return found


def split_item_ids(ids: Sequence[int], markers: ItemMarkers, has_reasoning: bool) -> dict[str, Any]:
    """The generated ``ids`` cut into the runs that output items get (docs/tito.md's rule):

    - ``reasoning``: from the first id through the one that ends the reasoning end marker
      (``</think>``, included, as is a generated ``<think>``); when reasoning never ends, up to the
      first call (or to the trailing end-of-turn ids). Only when the output has a reasoning item
      (else those ids belong to no item).
    - ``calls``: each tool call from the id that starts its start marker through the id that ends
      its end marker (``<tool_call>`` ... ``</tool_call>``), or to the last id before trailing
      end-of-turn ids when it is cut short.
    - ``message``: the ids after the reasoning and before the first call (or before the trailing
      end-of-turn ids).

    Whatever lies outside these runs (the end-of-turn id, whitespace between calls) belongs to no
    item. Markers are found in the decoded text, whichever ids spell them.
    Returns {"reasoning": list | None, "message": list, "calls": [list, ...]}.
    """
    ids = [int(i) for i in ids]
    end = len(ids)
    while end > 0 and ids[end - 1] in markers.trailing:
        end -= 1
    body = ids[:end]
    text = markers.decode(body) if body else ""
    positions = _Positions(body, markers.decode)
    start = 0
    think_ends = _occurrences(text, markers.think_end)
    if think_ends:
        start = positions.token_of(think_ends[0] + len(markers.think_end or "") - 1) + 1
    calls: list[list[int]] = []
    message_end = end
    char_start, previous = positions.length(start), -1
    closes = _occurrences(text, markers.call_end)
    for char in _occurrences(text, markers.call_start):
        if char < char_start:
            continue
        first = max(positions.token_of(char), start, previous + 1)
        if not calls:
            message_end = first
        close = next((c for c in closes if c > char), None)
        last = end - 1 if close is None else positions.token_of(close + len(markers.call_end or "") - 1)
        if last < first:
            continue
        calls.append(ids[first:last + 1])
        previous = last
    reasoning = None
    if has_reasoning:
        if not think_ends:  # reasoning never ended: it runs to the first call, or to the end
            start = message_end
        reasoning = ids[:start]
    return {"reasoning": reasoning, "message": ids[start:message_end], "calls": calls}


def _item_type(item: Any) -> str | None:
    return item.get("type") if isinstance(item, dict) else getattr(item, "type", None)


def _set_item_ids(item: Any, ids: list[int]) -> None:
    if isinstance(item, dict):
        item["token_ids"] = ids
    else:
        setattr(item, "token_ids", ids)  # openai's models keep extra fields and serialize them


def _turn_output_ids(context: Any) -> list[int] | None:
    output = raw_tokens(getattr(context, "output_messages", None))
    return None if output is None else [i for ids in output for i in ids]


def _runs(request: Any, context: Any, tokenizer: Any, ids: list[int], has_reasoning: bool) -> dict[str, Any] | None:
    markers = item_markers(getattr(context, "response_parser", None), tokenizer)
    if markers is None:
        return None
    runs = split_item_ids(ids, markers, has_reasoning)
    if getattr(request, "tools", None) and (markers.call_start is None or markers.call_end is None):
        # a tool parser without call markers (pythonic, JSON-only...): where its calls begin is not
        # known, so neither the message's run nor the calls' are given
        runs["message"], runs["calls"] = None, []
    return runs


def _ids_for(item: Any, runs: dict[str, Any], calls_before: int) -> list[int] | None:
    kind = _item_type(item)
    if kind == "reasoning":
        return runs["reasoning"]
    if kind == "message":
        return runs["message"]
    if kind == "function_call" and calls_before < len(runs["calls"]):
        return runs["calls"][calls_before]
    return None


def with_output_item_token_ids(request: Any, output: list | None, context: Any, tokenizer: Any) -> list | None:
    """``token_ids`` on each output item of a Responses response (``split_item_ids``' rule), when
    the request asks for ids; Harmony's items and output the rule cannot cut keep vLLM's shape."""
    if not getattr(request, "return_token_ids", None) or not output:
        return output
    ids = _turn_output_ids(context)
    if ids is None:
        return output
    runs = _runs(request, context, tokenizer, ids, any(_item_type(item) == "reasoning" for item in output))
    if runs is None:
        return output
    calls = 0
    for item in output:
        item_ids = _ids_for(item, runs, calls)
        calls += _item_type(item) == "function_call"
        if item_ids is not None:
            _set_item_ids(item, item_ids)
    return output


def with_item_done_token_ids(request: Any, event: Any, context: Any, tokenizer: Any) -> Any:
    """``token_ids`` on the item of a streamed ``response.output_item.done``: the same run as the
    item gets on the final response, cut from the ids generated so far (a finished item's run no
    longer changes). Other events pass through."""
    if getattr(event, "type", None) != "response.output_item.done" or not getattr(request, "return_token_ids", None):
        return event
    item = getattr(event, "item", None)
    ids = _turn_output_ids(context)
    if item is None or ids is None:
        return event
    seen = getattr(context, "_toolkit_tito_items", None)
    if seen is None:
        seen = []
        context._toolkit_tito_items = seen  # the types of the items already done, in order
    kind = _item_type(item)
    runs = _runs(request, context, tokenizer, ids, "reasoning" in seen or kind == "reasoning")
    if runs is not None:
        item_ids = _ids_for(item, runs, seen.count("function_call"))
        if item_ids is not None:
            _set_item_ids(item, item_ids)
    seen.append(kind)
    return event
