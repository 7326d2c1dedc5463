"""SkyRL's ``exec``'d backport of vllm-project/vllm#41602 into ``GPUModelRunner.init_fp8_kv_scales``,
ported (see codemods.py). A pure code fix: the patched vLLM imports nothing from the catalog."""
