"""NeMo-RL's string replacement in vLLM's ``Eagle3LlamaForCausalLM.__init__`` (its lm_head ownership),
ported (see codemods.py). A pure code fix: the patched vLLM imports nothing from the catalog."""
