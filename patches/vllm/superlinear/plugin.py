"""vLLM general plugin: superlinear attention, loaded in every vLLM process.

Off (``TOOLKIT_ATTENTION_BACKEND`` unset, empty or ``dense``): registers nothing and imports nothing
but the standard-library switch; the engine is stock.
On (``TOOLKIT_ATTENTION_BACKEND=superlinear``):

* CPU: ``AttentionBackendEnum.CUSTOM`` names the CPU backend (``backend.py``), and ``CPU_ATTN``,
  which vLLM's CPU platform always picks whatever was asked for, is overridden by the same backend;
* CUDA (and any other platform): ``CUSTOM`` names the CUDA backend (``cuda_backend.py``, over
  vLLM's Triton paged cache); ``--attention-backend CUSTOM`` selects it.

The configuration is validated here, so a bad setting stops the server at start-up with one sentence.
"""

from __future__ import annotations

BACKEND_PATH = "toolkit.patches.vllm.superlinear.backend.SuperlinearCPUBackend"
CUDA_BACKEND_PATH = "toolkit.patches.vllm.superlinear.cuda_backend.SuperlinearCUDABackend"


def registrations(on_cpu: bool) -> dict[str, str]:
    """``AttentionBackendEnum`` member name -> backend class path, for a CPU or a GPU platform."""
    if on_cpu:
        return {"CUSTOM": BACKEND_PATH, "CPU_ATTN": BACKEND_PATH}
    return {"CUSTOM": CUDA_BACKEND_PATH}


def register() -> None:
    from toolkit.patches.common.superlinear.switch import backend_enabled

    if not backend_enabled():  # raises on a value it does not understand
        return
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import (
        AttentionBackendEnum,
        register_backend,
    )

    from toolkit.patches.common.superlinear.config import load_config

    load_config()  # environment part; vLLM's additional config is checked when layers are built
    for name, path in registrations(current_platform.is_cpu()).items():
        register_backend(AttentionBackendEnum[name], path)
