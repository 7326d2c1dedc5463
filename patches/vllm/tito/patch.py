"""The ``toolkit.patches.vllm.tito`` patch declaration: what it rewrites, on which versions."""

from toolkit.patches.vllm.tito.codemods import OnlineRendererTransformer, ProtocolTransformer, ServingTransformer
from toolkit.codemod import FileEdit, Patch

PATCH = Patch(
    id="tito",
    engine="vllm",
    versions=(">=0.32,<0.34",),
    files=(
        FileEdit("entrypoints/openai/chat_completion/protocol.py", (ProtocolTransformer,)),
        FileEdit("renderers/online_renderer.py", (OnlineRendererTransformer,)),
        FileEdit("entrypoints/openai/chat_completion/serving.py", (ServingTransformer,)),
    ),
    summary="input_ids as the exact prompt of chat requests, token_id on logprobs, logprob_start_len",
    runtime_modules=("toolkit.patches.vllm.tito.runtime",),
)
