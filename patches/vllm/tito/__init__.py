"""tito: token in, token out on vLLM's chat completions.

``input_ids`` on a chat request is the prompt, exactly (no chat template, no tokenization), with every
sampling option, tool and reasoning parsing and streaming working as they do with ``messages``;
``token_id`` on every logprob entry; ``logprob_start_len`` for prompt logprobs from a position on;
``TOOLKIT_RETURN_TOKEN_IDS=1`` turns vLLM's own ``return_token_ids`` on for every chat request.
Bad input is a 400 naming the field. The contract, with examples: docs/tito.md.
"""

from patches.vllm.tito.codemods import OnlineRendererTransformer, ProtocolTransformer, ServingTransformer
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
    runtime_modules=("patches.vllm.tito.runtime",),
)
