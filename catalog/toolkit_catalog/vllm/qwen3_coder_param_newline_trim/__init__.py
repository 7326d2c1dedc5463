"""prime-rl's copy of vLLM's ``_qwen3_arg_converter`` (qwen3_coder tool parameters), ported (see
codemods.py). A pure code fix: the patched vLLM imports nothing from the catalog."""
