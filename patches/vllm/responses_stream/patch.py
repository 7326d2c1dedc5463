"""The ``toolkit.patches.vllm.responses_stream`` patch declaration: what it rewrites, on which versions."""

from __future__ import annotations

from toolkit.codemod import FileEdit, Patch

from toolkit.patches.vllm.responses_stream.codemods import (
    BackgroundStreamEnd,
    ImportRuntime,
    NonStreamingItems,
    ReplaceSimpleStreaming,
    TerminalEvents,
)

PATCH = Patch(
    id="responses-stream",
    engine="vllm",
    versions=(">=0.32,<0.34",),
    files=(
        FileEdit(
            "entrypoints/openai/responses/serving.py",
            (ImportRuntime, ReplaceSimpleStreaming, NonStreamingItems, TerminalEvents, BackgroundStreamEnd),
        ),
    ),
    summary="Responses API streaming: reasoning, text and tool calls in any order, grammar-correct events",
    runtime_modules=("toolkit.patches.vllm.responses_stream.runtime",),
)
