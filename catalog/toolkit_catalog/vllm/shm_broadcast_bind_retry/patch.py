"""The ``shm-broadcast-bind-retry`` declaration: one vLLM file, one transformer, no runtime."""

from toolkit.declare import FileEdit, Patch

CODEMODS = "toolkit_catalog.vllm.shm_broadcast_bind_retry.codemods"

PATCH = Patch(
    id="shm-broadcast-bind-retry",
    engine="vllm",
    # vLLM 0.24.0-0.27.1: the releases that probe the port with get_open_port() and bind it later
    # (two versions of the file, one at 0.24-0.26, one at 0.27).
    versions=">=0.24.0,<=0.27.1",
    files=(FileEdit("distributed/device_communicators/shm_broadcast.py",
                    (f"{CODEMODS}:MessageQueueTransformer",)),),
    summary="MessageQueue retries the bind of its remote socket on the next free port instead of dying "
            "with EADDRINUSE when a peer took the probed port (node-spanning engines at startup)",
    not_needed=(">=0.28.0", "vLLM 0.28 binds the remote socket to port 0 and reads the port back: there is "
                            "no probe left to race"),
)
