"""The ``dp-coordinator-startup-timeout`` declaration: one vLLM file, one transformer, no runtime."""

from toolkit.declare import FileEdit, Patch

CODEMODS = "toolkit_catalog.vllm.dp_coordinator_startup_timeout.codemods"

PATCH = Patch(
    id="dp-coordinator-startup-timeout",
    engine="vllm",
    # every known release: each hard-codes `timeout = 120` there (one version of the method)
    versions=">=0.24.0,<=0.33.0",
    files=(FileEdit("v1/engine/coordinator.py", (f"{CODEMODS}:DPCoordinatorTransformer",)),),
    summary="the data-parallel coordinator waits TOOLKIT_DP_COORDINATOR_STARTUP_TIMEOUT seconds (default "
            "300) for its child at startup instead of a hard-coded 120 (multi-node DP launches under load)",
)
