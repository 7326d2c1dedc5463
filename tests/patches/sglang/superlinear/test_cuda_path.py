"""The SGLang backend's CUDA path (the Triton paged kernels over SGLang's token pool) on CPU tensors.

``cuda_driver.py`` runs in SGLang 0.5.9 and 0.5.23 under ``TRITON_INTERPRET=1`` with
``TOOLKIT_SUPERLINEAR_IMPL=triton``: real ``ReqToTokenPool`` / ``MHATokenToKVPool`` (the pool's own
cache write), ``RadixAttention``, ``ForwardBatch`` in extend and decode modes.  Prompts, chunks over
a cached prefix, one-token extends and decodes equal the naive reference; in the covering regime
they equal dense attention; the CUDA-graph hooks accept a decode capture, refuse an extend capture,
and a decode replayed with the next step's lengths in the same tensors equals the reference, with
every request tensor refusing host reads (``tests/harness/host_reads.py``: no synchronisation, no
data-dependent shape).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness.channel import run_driver
from tests.harness.fixtures import SGLANG_ENVS, ensure_engine_python, sglang_env

pytestmark = [pytest.mark.engine]

DRIVER = Path(__file__).with_name("cuda_driver.py")


@pytest.mark.parametrize("env_name", SGLANG_ENVS)
def test_cuda_path_over_a_real_token_pool_equals_reference(env_name):
    python = ensure_engine_python(env_name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKIT_")}
    env.update(sglang_env(), TRITON_INTERPRET="1", TOOLKIT_SUPERLINEAR_IMPL="triton")
    got = run_driver([python, str(DRIVER)], env=env, timeout=900).ok()

    assert got["kernels_interpreted"], got
    assert got["extend_capture_refused"] and got["seq_len_fill_value"] == 1, got
    cases = got["cases"]
    assert set(cases) == {"window_spans", "covering", "graph_replay"}
    assert set(cases["covering"]) == {"prompts", "chunks", "chunks_vs_dense", "decode", "decode_vs_dense"}
    for name, case in cases.items():
        for key, error in case.items():
            assert isinstance(error, float) and error <= 1e-5, (name, key, error)
