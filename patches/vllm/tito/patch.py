"""The ``toolkit.patches.vllm.tito`` patch declaration: what it rewrites, on which versions."""

from toolkit.declare import FileEdit, Patch

# Transformers by name: the codemods (libcst) load only when a file is rewritten.
CODEMODS = "toolkit.patches.vllm.tito.codemods"

# 0.24-0.26 have no _reused_prompt_token_ids: the renderer codemod builds the reuse branches 0.27 added;
# 0.24 has OnlineRenderer's methods on OpenAIServingRender in entrypoints/serve/render/serving.py
PATCH = Patch(id="tito", engine="vllm", versions=">=0.24,<0.34",
              summary="input_ids as the exact prompt of chat requests, prefix_token_ids splice, /v1/chat/completions/tokens, "
                      "token_id on logprobs, logprob_start_len; input_ids and token ids on /v1/responses",
              files=(FileEdit("entrypoints/openai/chat_completion/protocol.py", (f"{CODEMODS}:ProtocolTransformer",)),
                     FileEdit("renderers/online_renderer.py", (f"{CODEMODS}:OnlineRendererTransformer",), versions=">=0.25"),
                     FileEdit("entrypoints/serve/render/serving.py", (f"{CODEMODS}:OnlineRendererTransformer",),
                              versions="<0.25"),
                     FileEdit("entrypoints/openai/chat_completion/serving.py", (f"{CODEMODS}:ServingTransformer",)),
                     FileEdit("entrypoints/openai/chat_completion/api_router.py", (f"{CODEMODS}:ApiRouterTransformer",)),
                     FileEdit("entrypoints/openai/responses/protocol.py", (f"{CODEMODS}:ResponsesProtocolTransformer",)),
                     FileEdit("entrypoints/openai/responses/serving.py", (f"{CODEMODS}:ResponsesServingTransformer",))),
              runtime_modules=("toolkit.patches.vllm.tito.runtime", "toolkit.patches.vllm.tito.response_items"),
              # both edit OpenAIServingResponses.responses_full_generator and responses_stream_generator
              after=("responses-stream",))
