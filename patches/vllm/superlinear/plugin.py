"""vLLM general plugin: register superlinear attention (loaded in every vLLM process).

* Always: ``AttentionBackendEnum.CUSTOM`` names the superlinear backend (a class path only, nothing
  is imported), so ``--attention-backend CUSTOM`` selects it where vLLM honours the choice.
* Only with ``TOOLKIT_ATTENTION_BACKEND=superlinear``: ``CPU_ATTN`` (which vLLM's CPU platform always
  picks, whatever was asked for) is overridden by the same backend. Without it the engine is stock.

The configuration is validated here, so a bad setting stops the server at start-up with one sentence.
Imports nothing heavy when the backend is off.
"""

from __future__ import annotations

BACKEND_PATH = "patches.vllm.superlinear.backend.SuperlinearCPUBackend"


def register() -> None:
    from vllm.v1.attention.backends.registry import (
        AttentionBackendEnum,
        register_backend,
    )

    from patches.vllm.superlinear.config import backend_enabled, load_config

    enabled = backend_enabled()  # raises on a value it does not understand
    register_backend(AttentionBackendEnum.CUSTOM, BACKEND_PATH)
    if enabled:
        load_config()  # environment part; vLLM's additional config is checked when layers are built
        register_backend(AttentionBackendEnum.CPU_ATTN, BACKEND_PATH)
