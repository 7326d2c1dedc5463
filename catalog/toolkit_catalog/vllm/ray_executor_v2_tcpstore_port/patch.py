"""The ``ray-executor-v2-tcpstore-port`` declaration: one vLLM file, one transformer, no runtime."""

from toolkit.declare import FileEdit, Patch

CODEMODS = "toolkit_catalog.vllm.ray_executor_v2_tcpstore_port.codemods"

PATCH = Patch(
    id="ray-executor-v2-tcpstore-port",
    engine="vllm",
    # vLLM 0.25.0-0.28.0: the releases with `_select_tcpstore_port` (0.24 has no RayExecutorV2 port
    # probe); one sha256 of the file across all six.
    versions=">=0.25.0,<=0.28.0",
    files=(FileEdit("v1/executor/ray_executor_v2.py", (f"{CODEMODS}:RayExecutorV2Transformer",)),),
    summary="RayExecutorV2 searches the TCPStore port past the broadcast MessageQueue's window when "
            "VLLM_PORT is set (a node-spanning engine no longer dies with EADDRINUSE at startup)",
    not_needed=(">=0.29.0", "vLLM 0.29 binds the TCPStore in the rank-0 worker itself (port 0, kept alive "
                            "until init_process_group): no probed port is left for the queue to take"),
)
