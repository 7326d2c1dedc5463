"""The superlinear backend on every SGLang release it claims, one short subprocess per release (no server).

SGLang 0.5.9 and 0.5.10 have no plugin mechanism: the ``superlinear-backend`` patch is applied to a
private copy of the release (``private_sglang.py``) and reverted byte for byte (on 0.5.9 the stock
copy is run first: it refuses the name). From 0.5.11 SGLang
loads general plugins: this package's entry point registers the backend in SGLang's own
``load_plugins()``. Either way ``release_driver.py`` then goes through SGLang's code as a server
would: the CLI takes ``--attention-backend superlinear``, the batch set-up computes positions on CPU
tensors (PyTorch helpers: ``support_triton("superlinear")`` is False on the CPU engine), the backend
is built by the attention registry's factory and its prompts, chunks over a cached prefix and
decodes over SGLang's real token pools equal the naive reference (and dense attention where the
spans cover the prefix). The files these depend on differ in every release (their sha256 groups are
one release each), so each release runs once: SGLANG_PROVED in tests/harness/fixtures.py.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.harness.channel import run_driver
from tests.harness.fixtures import SGLANG_PROVED, ensure_engine_python, sglang_env

pytestmark = [pytest.mark.engine]

DRIVER = Path(__file__).with_name("release_driver.py")


def run(python: str, mode: str, **env: str) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKIT_")}
    full.update(sglang_env(), **env)
    return run_driver([python, str(DRIVER), mode], env=full, timeout=300, cwd="/").ok()


def drive(python: str, mode: str, **env: str) -> dict:
    got = run(python, mode, **env)
    assert got["cli"] == "superlinear", got
    assert got["support_triton"] is False and got["positions"] == [3, 4, 0, 1, 2, 3], got
    assert got["factory"] == "toolkit.patches.sglang.superlinear.plugin", got
    assert got["extend_capture_refused"] and got["seq_len_fill_value"] == 1, got
    assert set(got["cases"]) == {"window_spans"} and set(got["cases"]["window_spans"]) == {"prompts", "chunks", "decode"}
    for key, error in got["cases"]["window_spans"].items():
        assert isinstance(error, float) and error <= 1e-5, (key, error)
    return got


@pytest.mark.parametrize("version", SGLANG_PROVED["superlinear-backend"])
def test_the_patch_selects_and_runs_the_backend(version, tmp_path):
    from tests.patches.sglang.token_ids.private_sglang import private_install
    from toolkit import apply_patch, revert_patch
    from toolkit.discovery import find_engines
    from toolkit.patches.sglang.superlinear_backend.patch import PATCH

    python = private_install(ensure_engine_python(f"sglang-{version}"), tmp_path)
    (engine,) = [e for e in find_engines(python) if e.engine == "sglang"]

    def shas() -> list[str]:
        return [hashlib.sha256((Path(engine.package_dir) / e.relpath).read_bytes()).hexdigest() for e in PATCH.files]

    before = shas()
    if version == SGLANG_PROVED["superlinear-backend"][0]:  # the control: stock SGLang knows no such backend
        stock = run(python, "patch")
        assert stock["cli"] is None and stock["factory"] is None and stock["support_triton"] is True, stock
    assert apply_patch(engine="sglang", patches=["superlinear-backend"], python=python)
    try:
        drive(python, "patch")
    finally:
        assert revert_patch(engine="sglang", patches=["superlinear-backend"], python=python)
    assert shas() == before


@pytest.mark.parametrize("version", SGLANG_PROVED["superlinear-plugin"])
def test_the_plugin_selects_and_runs_the_backend(version):
    drive(ensure_engine_python(f"sglang-{version}"), "plugin", TOOLKIT_ATTENTION_BACKEND="superlinear")
