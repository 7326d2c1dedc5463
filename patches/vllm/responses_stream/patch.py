"""The ``toolkit.patches.vllm.responses_stream`` patch declaration: what it rewrites, on which versions."""

from __future__ import annotations

from toolkit.declare import FileEdit, Patch

# Transformers by name: the codemods (libcst) load only when a file is rewritten.
CODEMODS = "toolkit.patches.vllm.responses_stream.codemods"


PATCH = Patch(id="responses-stream", engine="vllm", versions=">=0.24,<0.34",
              summary="Responses API streaming: reasoning, text and tool calls in any order, grammar-correct events",
              files=(FileEdit("entrypoints/openai/responses/serving.py", (f"{CODEMODS}:ServingTransformer",)),),
              runtime_modules=("toolkit.patches.vllm.responses_stream.runtime",))
