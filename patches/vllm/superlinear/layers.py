"""What the vLLM backends (CPU and CUDA) share: the configuration and which layers they serve.

Runs inside vLLM's processes: imports vLLM's config and logger, nothing of the patch engine.
"""

from __future__ import annotations

from vllm.config import get_current_vllm_config
from vllm.logger import init_logger
from vllm.v1.attention.backend import AttentionType

from toolkit.patches.common.superlinear.config import SuperlinearConfig, load_config

# A child of the "vllm" logger: vLLM configures handlers for its own namespace only.
logger = init_logger("vllm.toolkit_superlinear")

ADDITIONAL_CONFIG_KEY = "superlinear"


def engine_config() -> SuperlinearConfig:
    """The validated configuration: environment, then vLLM's ``additional_config["superlinear"]``."""
    additional = getattr(get_current_vllm_config(), "additional_config", None) or {}
    section = additional.get(ADDITIONAL_CONFIG_KEY) if isinstance(additional, dict) else None
    return load_config(engine_config=section, engine_source=f"--additional-config {ADDITIONAL_CONFIG_KEY!r}")


def serves_layer(impl, quantized_kv: bool, dense_name: str) -> bool:
    """Whether superlinear attention replaces this layer's attention (causal self-attention of a
    decoder, no window, ALiBi, sinks, soft-capping or quantized cache); otherwise warns once that
    the layer keeps ``dense_name``."""
    reasons = []
    if impl.attn_type != AttentionType.DECODER:
        reasons.append(f"attention type {impl.attn_type}")
    if impl.sliding_window not in (-1, None, (-1, -1)):
        reasons.append("sliding window")
    if impl.alibi_slopes is not None:
        reasons.append("ALiBi")
    if getattr(impl, "sinks", None) is not None:
        reasons.append("attention sinks")
    if impl.logits_soft_cap:
        reasons.append("logit soft-capping")
    if quantized_kv:
        reasons.append("quantized KV cache")
    if reasons:
        logger.warning_once("superlinear attention: a layer keeps %s (%s)", dense_name, ", ".join(reasons))
        return False
    logger.info_once("superlinear attention on (%s)", impl.superlinear.describe())
    return True
