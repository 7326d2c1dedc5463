"""Clients of the routes that patched engines serve, for the user's own code (no engine, libcst or patch
engine needed): ``patch_study`` drives vLLM's /v1/patch_sweep."""
