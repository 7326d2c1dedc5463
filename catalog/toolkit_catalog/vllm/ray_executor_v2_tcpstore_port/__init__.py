"""NeMo-RL's string replacement in vLLM's ``RayExecutorV2._select_tcpstore_port``, ported (see
codemods.py). A pure code fix: the patched vLLM imports nothing from the catalog."""
