"""vLLM general plugin: superlinear attention, loaded in every vLLM process.

Off (``TOOLKIT_ATTENTION_BACKEND`` unset, empty or ``dense``): registers nothing and imports nothing
but the standard-library switch; the engine is stock.
On (``TOOLKIT_ATTENTION_BACKEND=superlinear``): ``AttentionBackendEnum.CUSTOM`` names the superlinear
backend (``--attention-backend CUSTOM`` selects it where vLLM honours the choice), and ``CPU_ATTN``,
which vLLM's CPU platform always picks whatever was asked for, is overridden by the same backend.

The configuration is validated here, so a bad setting stops the server at start-up with one sentence.
"""

from __future__ import annotations

BACKEND_PATH = "toolkit.patches.vllm.superlinear.backend.SuperlinearCPUBackend"


def register() -> None:
    from toolkit.patches.common.superlinear.switch import backend_enabled

    if not backend_enabled():  # raises on a value it does not understand
        return
    from vllm.v1.attention.backends.registry import (
        AttentionBackendEnum,
        register_backend,
    )

    from toolkit.patches.common.superlinear.config import load_config

    load_config()  # environment part; vLLM's additional config is checked when layers are built
    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_PATH)
    register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND_PATH)
