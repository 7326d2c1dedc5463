"""Layer 1 of the Responses streaming state machine: raw model text to ordered pieces.

:class:`Segmenter` cuts model text, delivered in any chunking, into ordered ``(kind, text)`` pieces --
reasoning, text, tool-call bodies, and controls where a marker stood -- at the markers of the
configured parsers (``<think>``, ``</think>``, ``<tool_call>``, ``</tool_call>`` ...). It holds back
only a suffix that could be the start of a marker, so markup never leaks out as text and nothing else
is delayed. :class:`Markers` names those strings; :mod:`.item_machine` turns the pieces into items.
"""

from __future__ import annotations

from dataclasses import dataclass

# piece kinds: content of the current state ...
TEXT, REASONING, TOOL = "text", "reasoning", "tool"
# ... and controls, where a marker stood (``tool_cut``: the output ended inside a tool call)
REASONING_END, TOOL_OPEN, TOOL_CLOSE, TOOL_CUT = "reasoning_end", "tool_open", "tool_close", "tool_cut"


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
