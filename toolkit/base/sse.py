"""Server-sent events as the OpenAI-compatible servers send them (standard library only)."""

from __future__ import annotations

import json
from typing import Iterable, Iterator


def iter_sse(lines: Iterable[str]) -> Iterator[dict]:
    """The ``data:`` payloads of an SSE stream as they complete, parsed as JSON; ends at ``[DONE]``
    (comments and other fields skipped). ``lines`` may be a live stream (``response.iter_lines()``)."""
    data: list[str] = []
    for line in [*lines, ""] if isinstance(lines, (list, tuple)) else _with_end(lines):
        line = line.rstrip("\r")
        if not line:
            if data:
                payload = "\n".join(data)
                data = []
                if payload.strip() == "[DONE]":
                    return
                yield json.loads(payload)
            continue
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" ") if line[5:6] == " " else line[5:])


def _with_end(lines: Iterable[str]) -> Iterator[str]:
    yield from lines
    yield ""  # a stream may end without the blank line after its last event


def parse_sse(body: str | Iterable[str]) -> list[dict]:
    """Every ``data:`` payload of a whole SSE body (or its lines), parsed as JSON."""
    return list(iter_sse(body.splitlines() if isinstance(body, str) else body))
