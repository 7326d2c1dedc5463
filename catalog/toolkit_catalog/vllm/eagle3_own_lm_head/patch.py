"""The ``eagle3-own-lm-head`` declaration: one vLLM file, one transformer, no runtime."""

from toolkit.declare import FileEdit, Patch

CODEMODS = "toolkit_catalog.vllm.eagle3_own_lm_head.codemods"

PATCH = Patch(
    id="eagle3-own-lm-head",
    engine="vllm",
    # every known release: none sets has_own_lm_head on the Llama EAGLE-3 drafter (five versions of the file)
    versions=">=0.24.0,<=0.33.0",
    files=(FileEdit("model_executor/models/llama_eagle3.py", (f"{CODEMODS}:Eagle3Transformer",)),),
    summary="a Llama EAGLE-3 drafter with a truncated draft vocabulary keeps its own lm_head instead of "
            "the proposer sharing the target's (wrong-sized) one",
)
