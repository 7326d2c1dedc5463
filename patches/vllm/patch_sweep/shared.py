"""Names the patch-sweep modules share (the switch, the worker RPC prefix, the logger), so that the
entry points (``runtime``) and what they load on demand (``routes``, ``worker``) import this module
and never each other. Standard library only."""

from __future__ import annotations

import logging

from toolkit.patches.common.env import env_flag

ENABLE_ENV = "TOOLKIT_ENABLE_PATCHING"
STEERING_ENV = "TOOLKIT_ENABLE_STEERING"
WORKER_PREFIX = "toolkit_patch_sweep_"
PLAN_KEY = "toolkit_patch_sweep"  # a sweep/capture plan's key in SamplingParams.extra_args (stamped data)
SHARED_PREFIX = "shared_prefix"  # a cell plan's first patched position: the tokens before it may be shared
STEER_KEY = "toolkit_steer"  # the steering plan's key in SamplingParams.extra_args (a stamped JSON string)



def log() -> logging.Logger:
    """vLLM's logger when vLLM is loaded (so lines show up in the server log), else a plain one; looked up
    at call time, since this module is imported before vLLM configures logging."""
    try:
        from vllm.logger import init_logger
    except ImportError:
        return logging.getLogger("toolkit.patch_sweep")
    return init_logger("vllm.toolkit.patch_sweep")


def enabled() -> bool:
    return env_flag(ENABLE_ENV)


def steering_enabled() -> bool:
    return env_flag(STEERING_ENV)
