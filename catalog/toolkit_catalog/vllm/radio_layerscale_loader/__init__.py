"""NeMo-RL's string replacement of vLLM's ``RadioModel.load_weights`` (LayerScale weights), ported
(see codemods.py). A pure code fix: the patched vLLM imports nothing from the catalog."""
