"""An out-of-tree serving-toolkit patch: vLLM's chat completions clamp ``max_tokens`` to the context
left instead of answering 400 (see README.md). Nothing is imported here: ``runtime`` runs inside
every vLLM process and must not drag libcst or the patch engine in with it."""
