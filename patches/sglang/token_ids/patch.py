"""The ``toolkit.patches.sglang.token_ids`` patch declaration: what it rewrites, on which versions."""

from toolkit.patches.sglang.token_ids.codemods import ProtocolTransformer, ServingChatTransformer
from toolkit.codemod import FileEdit, Patch

PATCH = Patch(
    id="token-ids",
    engine="sglang",
    versions=("==0.5.9", "==0.5.23"),
    files=(
        FileEdit("srt/entrypoints/openai/protocol.py", (ProtocolTransformer,)),
        FileEdit("srt/entrypoints/openai/serving_chat.py", (ServingChatTransformer,)),
    ),
    summary="prompt_token_ids and per-choice token_ids on chat completions, streaming included",
    runtime_modules=("toolkit.patches.sglang.token_ids.runtime",),
)
