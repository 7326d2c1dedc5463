"""The ``toolkit.patches.sglang.token_ids`` patch declaration: what it rewrites, on which versions."""

from toolkit.declare import FileEdit, Patch

# Transformers by name: the codemods (libcst) load only when a file is rewritten.
CODEMODS = "toolkit.patches.sglang.token_ids.codemods"

PATCH = Patch(id="token-ids", engine="sglang", versions=">=0.5.9,<=0.5.23",
              summary="prompt_token_ids and per-choice token_ids on chat completions, streaming included",
              files=(FileEdit("srt/entrypoints/openai/protocol.py", (f"{CODEMODS}:ProtocolTransformer",)),
                     FileEdit("srt/entrypoints/openai/serving_chat.py", (f"{CODEMODS}:ServingChatTransformer",))),
              runtime_modules=("toolkit.patches.sglang.token_ids.runtime",),
              # both edit ChatCompletionResponse._serialize (and, from 0.5.17, _convert_to_internal_request)
              after=("tito",))
