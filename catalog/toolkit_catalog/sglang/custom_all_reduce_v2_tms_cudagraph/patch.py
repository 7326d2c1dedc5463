"""The ``custom-all-reduce-v2-tms-cudagraph`` declaration: one SGLang file, one transformer, no runtime."""

from toolkit.declare import FileEdit, Patch

CODEMODS = "toolkit_catalog.sglang.custom_all_reduce_v2_tms_cudagraph.codemods"

PATCH = Patch(
    id="custom-all-reduce-v2-tms-cudagraph",
    engine="sglang",
    # SGLang 0.5.10 (the first with custom_all_reduce_v2.py) to 0.5.14: six versions of the file
    versions=">=0.5.10,<=0.5.14",
    files=(FileEdit("srt/distributed/device_communicators/custom_all_reduce_v2.py",
                    (f"{CODEMODS}:CustomAllReduceV2Transformer",)),),
    summary="custom all-reduce v2 leaves the CUDA-graph capture flag off under SGLANG_MEMORY_SAVER_CUDA_GRAPH "
            "(colocated training: no stale IPC addresses at graph replay)",
    not_needed=(">=0.5.15", "SGLang 0.5.15 carries the fix (sgl-project/sglang#27948, the one NeMo-RL backports)"),
)
