"""The vLLM CUDA backend (``cuda_backend.py``) driven on CPU tensors in the real vLLM venvs.

``cuda_driver.py`` runs in vLLM 0.32.0 and the 0.33.0 overlay under ``TRITON_INTERPRET=1``: the
backend registered as ``CUSTOM`` (what the plugin does on a GPU) and validated as vLLM's CUDA
platform validates a selected backend, its metadata builder fed vLLM's ``CommonAttentionMetadata``,
its forward on vLLM's logical cache tensor with the NHD and HND physical layouts; the Triton paged
kernels read K/V through the block table.  Ragged batches (decodes first, a chunk over a cached
prefix, a prompt) equal the naive reference; in the covering regime they equal dense attention; a
decode batch built for CUDA-graph capture and then replayed with new lengths in the same tensors
equals the reference for the new lengths, also when every request tensor refuses host reads
(``tests/harness/host_reads.py``: no synchronisation, no data-dependent shape).

The vLLM venvs have no Triton (vLLM's CPU build ships without it): the driver imports the dev
venv's ``triton`` package (same Python, same torch) through ``PYTHONPATH``, and only the kernels
use it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.harness.channel import run_driver
from tests.harness.fixtures import VLLM_ENVS, ensure_engine_python, ensure_tiny_model

pytestmark = [pytest.mark.engine]

DRIVER = Path(__file__).with_name("cuda_driver.py")


def _triton_path(tmp_path: Path) -> Path:
    """A directory holding only this interpreter's ``triton`` package (for the vLLM venv's path)."""
    import triton  # the dev venv has it: a missing triton fails, never skips

    folder = tmp_path / "triton-only"
    folder.mkdir()
    (folder / "triton").symlink_to(Path(triton.__file__).parent)
    return folder


def _config_only_model(tmp_path: Path) -> Path:
    """The tiny model's config with GQA 4/2 and head dim 32 (no weights: nothing is loaded)."""
    tiny = Path(ensure_tiny_model())
    model = tmp_path / "model"
    model.mkdir()
    config = json.loads((tiny / "config.json").read_text())
    config.update(num_attention_heads=4, num_key_value_heads=2, head_dim=32, hidden_size=128,
                  max_position_embeddings=4096)
    (model / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (tiny / name).is_file():
            shutil.copy(tiny / name, model / name)
    return model


@pytest.mark.parametrize("env_name", VLLM_ENVS)
def test_cuda_backend_forward_equals_reference_on_vllms_gpu_cache_layout(env_name, tmp_path):
    python = ensure_engine_python(env_name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKIT_")}
    env.update(VLLM_TARGET_DEVICE="cpu", TRITON_INTERPRET="1", TOOLKIT_ATTENTION_BACKEND="superlinear",
               PYTHONPATH=os.pathsep.join(filter(None, [str(_triton_path(tmp_path)), env.get("PYTHONPATH")])))
    got = run_driver([python, str(DRIVER), str(_config_only_model(tmp_path))], env=env, timeout=900).ok()

    assert got["interpreted"] and got["kernels_interpreted"], got
    assert got["backend"] == "toolkit.patches.vllm.superlinear.cuda_backend.SuperlinearCUDABackend"
    assert got["name_maps_back"] and got["invalid_reasons"] == [], got
    assert got["invalid_reasons_fp8"], "a quantized cache must be refused at selection"
    assert got["cudagraph_support"] == "UNIFORM_SINGLE_TOKEN_DECODE"
    assert got["reorder_batch_threshold"] == 1  # vLLM puts decodes first
    assert got["window_layer_served"] is False  # a sliding-window layer keeps vLLM's kernel
    cases = got["cases"]
    assert set(cases) == {f"{layout}/{name}" for layout in ("NHD", "HND")
                          for name in ("default", "window_spans", "covering")} | {"graph_decode"}
    for name, case in cases.items():
        for key, error in case.items():
            if key.startswith(("vs_", "replay_", "capture_")):
                assert isinstance(error, float) and error <= 1e-5, (name, key, error)
    assert cases["NHD/default"]["num_decodes"] == 3 and cases["NHD/covering"]["num_decodes"] == 2
    assert cases["graph_decode"]["num_decodes"] == 3
