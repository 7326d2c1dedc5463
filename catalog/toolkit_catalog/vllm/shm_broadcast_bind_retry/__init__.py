"""NeMo-RL's string replacement in vLLM's ``MessageQueue.__init__`` (the remote socket's bind),
ported (see codemods.py). A pure code fix: the patched vLLM imports nothing from the catalog."""
