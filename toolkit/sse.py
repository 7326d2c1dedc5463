"""Server-sent events as the OpenAI-compatible servers send them (standard library only)."""

from __future__ import annotations

import json
from typing import Iterable


def parse_sse(body: str | Iterable[str]) -> list[dict]:
    """The ``data:`` payloads of an SSE stream, parsed as JSON (``[DONE]`` and comments skipped)."""
    lines = body.splitlines() if isinstance(body, str) else body
    events: list[dict] = []
    data: list[str] = []
    for line in list(lines) + [""]:
        line = line.rstrip("\r")
        if not line:
            if data:
                payload = "\n".join(data)
                data = []
                if payload.strip() != "[DONE]":
                    events.append(json.loads(payload))
            continue
        if line.startswith("data:"):
            data.append(line[5:].lstrip(" ") if line[5:6] == " " else line[5:])
    return events
