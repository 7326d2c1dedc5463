"""NeMo-RL's string replacements in SGLang's ``CustomAllReduceV2`` (a backport of sglang#27948),
ported (see codemods.py). A pure code fix: the patched SGLang imports nothing from the catalog."""
