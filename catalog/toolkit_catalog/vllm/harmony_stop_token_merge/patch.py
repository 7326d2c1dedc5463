"""The ``harmony-stop-token-merge`` declaration: one vLLM file, one transformer, no runtime."""

from toolkit.declare import FileEdit, Patch

CODEMODS = "toolkit_catalog.vllm.harmony_stop_token_merge.codemods"

PATCH = Patch(
    id="harmony-stop-token-merge",
    engine="vllm",
    versions=">=0.24.0,<=0.24.0",  # vLLM 0.24.0, prime-rl's pin: the one release without the merge
    files=(FileEdit("entrypoints/openai/chat_completion/protocol.py",
                    (f"{CODEMODS}:ChatCompletionRequestTransformer",)),),
    summary="chat completions stop on the server's default stop tokens (harmony's <|call|> and <|return|> "
            "for gpt-oss) as well as the request's, instead of only the request's",
    not_needed=(">=0.25.0", "vLLM 0.25 merges the server-default stop_token_ids into each chat request "
                            "itself (vllm-project/vllm#22519)"),
)
