"""Fixtures and helpers for the kernel tests.

Triton kernels run on CPU through Triton's interpreter.  Triton decides at import time whether its
own library is interpreted, and again at every launch, so:

* this conftest sets ``TRITON_INTERPRET=1`` before anything imports triton and imports the kernel
  modules under it (so they are interpreted functions);
* it then restores the variable, so that other test suites' subprocesses do not inherit it, and the
  ``triton_device`` fixture sets it again for the duration of each Triton test.

``TRITON_INTERPRET=0`` in the environment (with a CUDA GPU) runs the same tests natively on the GPU.
"""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

if importlib.util.find_spec("torch") is None:  # the kernels need torch (the "kernels" extra)
    collect_ignore_glob = ["test_*.py"]
    torch = None
else:
    import torch

_NATIVE = os.environ.get("TRITON_INTERPRET") == "0"
_TRITON_IMPORTED_BEFORE = "triton" in sys.modules
_saved = os.environ.get("TRITON_INTERPRET")
if not _NATIVE:
    os.environ["TRITON_INTERPRET"] = "1"
try:
    import triton  # noqa: F401

    import toolkit.kernels.superlinear.triton.decode  # noqa: F401  (decorated now: interpreted or native)
    import toolkit.kernels.superlinear.triton.prefill  # noqa: F401
    import toolkit.kernels.superlinear.triton.paged_decode  # noqa: F401
    import toolkit.kernels.superlinear.triton.paged_prefill  # noqa: F401
    TRITON_IMPORT_ERROR = None
except Exception as exc:  # pragma: no cover - triton (or torch) missing or broken
    TRITON_IMPORT_ERROR = exc
finally:
    if _saved is None:
        os.environ.pop("TRITON_INTERPRET", None)
    else:
        os.environ["TRITON_INTERPRET"] = _saved


def kernels_are_interpreted() -> bool:
    from toolkit.kernels.superlinear.triton import search

    return type(search._search_kernel).__name__ == "InterpretedFunction"


@pytest.fixture
def triton_device(monkeypatch) -> str:
    """Device for Triton tests: "cpu" under the interpreter, or "cuda" with TRITON_INTERPRET=0."""
    if TRITON_IMPORT_ERROR is not None:
        pytest.skip(f"triton unavailable: {TRITON_IMPORT_ERROR}")
    if _NATIVE:
        if not torch.cuda.is_available():
            pytest.skip("TRITON_INTERPRET=0 needs a CUDA GPU")
        return "cuda"
    if _TRITON_IMPORTED_BEFORE or not kernels_are_interpreted():
        pytest.skip("triton was imported before tests/kernels/conftest.py could enable its "
                    "interpreter; run `python -m pytest tests/kernels`")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return "cpu"


# --------------------------------------------------------------------------------------------------
# The compiled CPU kernels (gather/native.py, gather/native_spans.py)


def _has_compiler() -> bool:
    from toolkit.kernels.superlinear.gather import native

    return native.compiler() is not None


requires_compiler = pytest.mark.skipif(torch is not None and not _has_compiler(),
                                       reason="no C++ compiler on this machine")


@pytest.fixture
def built_native(monkeypatch):
    """The compiled kernels on, loaded afresh by this process from the toolkit cache, where scripts/test.sh's
    setup builds them (scripts/build_kernels.py; run without it, the first test builds them there): a test of
    their results pays no C++ compile (~3 s each at -O3 here). The process's own state restored after. A test
    of the build itself takes ``fresh_native``."""
    from toolkit.kernels.superlinear.gather import native

    monkeypatch.setenv("TOOLKIT_SUPERLINEAR_NATIVE", "1")
    native.reset()
    yield
    native.reset()


@pytest.fixture
def fresh_native(built_native, monkeypatch, tmp_path):
    """``built_native`` with an empty cache dir: the kernels built afresh at first use (the kernels load
    lazily, so the cache dir read then is this one)."""
    monkeypatch.setenv("TOOLKIT_CACHE_DIR", str(tmp_path))
    return tmp_path


def two_calls_and_warnings(seed: int, dim: int):
    """The naive result, two gather calls' results and the RuntimeWarning lines the calls gave (a
    kernel that cannot be built must warn once and fall back to the torch path's equal results)."""
    import warnings

    from toolkit.kernels.superlinear.attention_spans import SuperlinearParams
    from toolkit.kernels.superlinear.gather import gather_superlinear_attention
    from toolkit.kernels.superlinear.naive import naive_superlinear_attention

    q1, q2, k, v = make_inputs(1, 4, 2, 300, dim, seed=seed)
    params = SuperlinearParams(sw_index=1)
    ref = naive_superlinear_attention(q1, q2, k, v, None, None, params)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = gather_superlinear_attention(q1, q2, k, v, None, None, params)
        again = gather_superlinear_attention(q1, q2, k, v, None, None, params)
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    return ref, out, again, messages


# --------------------------------------------------------------------------------------------------
# Data helpers


def exact_scores_tensor(shape, generator, dtype=None, device="cpu"):
    """Random values on a 1/4 grid in [-2, 2]: their dot products (D <= 256) are exact in fp32 and
    bf16 inputs, so every implementation computes bit-identical search scores and the top-k
    selection (ties included) must agree exactly."""
    x = torch.randint(-8, 9, shape, generator=generator).float() / 4
    return x.to(device=device, dtype=dtype or torch.float32)


def normal_tensor(shape, generator, dtype=None, device="cpu"):
    return torch.randn(shape, generator=generator).to(device=device, dtype=dtype or torch.float32)


def make_inputs(batch, heads, kv_heads, length, dim, seed=0, dtype=None, device="cpu",
                same_query=False, key_len=None):
    """q1 (exact grid), q2, k (exact grid), v (normal)."""
    g = torch.Generator().manual_seed(seed)
    key_len = length if key_len is None else key_len
    k = exact_scores_tensor((batch, kv_heads, key_len, dim), g, dtype, device)
    v = normal_tensor((batch, kv_heads, key_len, dim), g, dtype, device)
    q1 = exact_scores_tensor((batch, heads, length, dim), g, dtype, device)
    q2 = q1 if same_query else normal_tensor((batch, heads, length, dim), g, dtype, device)
    return q1, q2, k, v


def left_padding_mask(batch, key_len, pads, device="cpu"):
    mask = torch.ones(batch, key_len, dtype=torch.bool, device=device)
    for b, pad in enumerate(pads):
        mask[b, :pad] = False
    return mask


def dense_causal_reference(q2, k, v, positions, key_mask, scale=None):
    """Plain softmax attention of each query over all real keys <= its position (float64)."""
    batch, heads, query_len, dim = q2.shape
    group = heads // k.shape[1]
    kk = k.double().repeat_interleave(group, 1)
    vv = v.double().repeat_interleave(group, 1)
    scale = dim ** -0.5 if scale is None else scale
    logits = (q2.double() @ kk.transpose(-1, -2)) * scale
    keys = torch.arange(k.shape[2])
    allowed = keys <= positions[:, None, :, None]
    if key_mask is not None:
        allowed = allowed & key_mask[:, None, None, :]
    weights = torch.softmax(logits.masked_fill(~allowed, float("-inf")), -1).nan_to_num(0.0)
    return weights @ vv
