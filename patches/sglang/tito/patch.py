"""The ``toolkit.patches.sglang.tito`` patch declaration: what it rewrites, on which versions."""

from toolkit.declare import FileEdit, Patch

# Transformers by name: the codemods (libcst) load only when a file is rewritten.
CODEMODS = "toolkit.patches.sglang.tito.codemods"

PATCH = Patch(id="tito", engine="sglang", versions=">=0.5.9,<=0.5.23",
              summary="input_ids as the exact prompt of chat requests, prefix_token_ids splice, /v1/chat/completions/tokens, "
                      "token_id on logprobs, logprob_start_len",
              files=(FileEdit("srt/entrypoints/openai/protocol.py", (f"{CODEMODS}:ProtocolTransformer",)),
                     FileEdit("srt/entrypoints/openai/serving_chat.py", (f"{CODEMODS}:ServingChatTransformer",)),
                     FileEdit("srt/entrypoints/http_server.py", (f"{CODEMODS}:HttpServerTransformer",))),
              runtime_modules=("toolkit.patches.sglang.tito.runtime", "toolkit.patches.sglang.tito.logprob_ids"))
