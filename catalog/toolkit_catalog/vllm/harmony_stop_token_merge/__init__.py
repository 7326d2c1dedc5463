"""prime-rl's wrapper of vLLM's ``ChatCompletionRequest.to_sampling_params`` (the server's default
stop tokens), ported (see codemods.py). A pure code fix: the patched vLLM imports nothing from the
catalog."""
