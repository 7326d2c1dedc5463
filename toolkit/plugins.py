"""The engine plugins this package ships: what the engines load through their own entry points, no patch.

`toolkit list` shows them beside the patches, each with the releases it is proved on, read from the
plugin's own module (the module refuses, or names as not needed, what lies outside).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Plugin", "shipped"]


@dataclass(frozen=True)
class Plugin:
    id: str
    engine: str
    versions: str  # the releases it is proved on (PEP 440 range)
    entry_point: str  # the engine's entry-point group
    switch: str  # how a user turns it on
    summary: str
    notes: str = ""  # where it is not proved, and why


def shipped() -> list[Plugin]:
    from toolkit.patches.sglang.superlinear import plugin as sglang_plugin
    from toolkit.patches.vllm.superlinear import plugin as vllm_plugin

    return [
        Plugin("superlinear-plugin", "sglang", f"{sglang_plugin.SGLANG_RELEASES},<=0.5.23", "sglang.srt.plugins",
               "TOOLKIT_ATTENTION_BACKEND=superlinear, then --attention-backend superlinear",
               "superlinear attention as an SGLang attention backend (CPU included)",
               "SGLang 0.5.9 and 0.5.10 have no plugin loader: the superlinear-backend patch serves there"),
        Plugin("superlinear-plugin", "vllm", vllm_plugin.VLLM_RELEASES, "vllm.general_plugins",
               "TOOLKIT_ATTENTION_BACKEND=superlinear (on GPU, then --attention-backend CUSTOM)",
               "superlinear attention as vLLM's CPU attention backend, and as AttentionBackendEnum.CUSTOM on GPU",
               f"GPU (CUDA) only {vllm_plugin.CUDA_VLLM_RELEASES}: vLLM's Triton attention backend, which the CUDA "
               "backend builds on, is another module before 0.32 and was never tried there"),
    ]
