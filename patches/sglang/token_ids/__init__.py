"""token-ids: prompt and completion token ids on SGLang's chat completions, stream and non-stream.

Same wire contract as vLLM's ``return_token_ids``: ``prompt_token_ids`` on the response (on the first
chunk when streaming) and ``token_ids`` on each choice (the ids behind each chunk's text when
streaming). On per request with ``return_token_ids: true``, or for every request when the server
runs with ``TOOLKIT_RETURN_TOKEN_IDS=1``; otherwise responses are byte-identical to upstream's.
0.5.23's own non-streaming fields (``return_prompt_token_ids``, ``response_token_ids``...) keep working.
"""

# The declaration lives in .patch so that importing .runtime inside the engine loads neither
# libcst nor the patch engine.
