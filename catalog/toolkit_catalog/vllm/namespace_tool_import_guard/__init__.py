"""NeMo-RL's string replacement of vLLM's ``NamespaceTool`` import (``tool_parsers/utils.py``),
ported (see codemods.py). A pure code fix: the patched vLLM imports nothing from the catalog."""
