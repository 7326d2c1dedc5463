"""The superlinear backend on every SGLang release it claims, one short driver run per release (no server).

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

Where the release is an SGLang group release (``SGLANG_GROUP_RELEASES``), the driver runs are part of
that group's runs (tests/patches/sglang/group_runs.py ``superlinear_runs``): forks of the group's
interpreter, which has the third-party libraries imported, on the group's private copy after its
serving runs, when the copy's files are byte-identical to the release's again; each gets the
environment its own subprocess would (no ``TOOLKIT_*`` variable of the tests, ``sglang_env()``). So
there the plugin runs on that private copy rather than on the venv's own sglang: the same files, and
the toolkit's entry points still come from the venv's site-packages. The other releases (0.5.10.post1,
0.5.15.post1) run ``release_driver.py`` in a subprocess of their own, the patch on a private copy
and the plugin on the venv's interpreter. Both ways make the same runs and assert the same.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.harness.channel import run_driver
from tests.harness.fixtures import SGLANG_GROUP_RELEASES, SGLANG_PROVED, ensure_engine_python, sglang_env
from tests.patches.sglang.group_runs import group_runs, superlinear_runs
from tests.patches.sglang.token_ids.private_sglang import private_install

pytestmark = [pytest.mark.engine]

DRIVER = Path(__file__).with_name("release_driver.py")


def run(python: str, mode: str, **env: str) -> dict:
    full = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKIT_")}
    full.update(sglang_env(), **env)
    return run_driver([python, str(DRIVER), mode], env=full, timeout=300, cwd="/").ok()


def runs(version: str, tmp_path_factory) -> dict:
    """``superlinear_runs`` of ``version``: its group's, or in a subprocess each (on a private copy
    where the patch is applied, else on the venv's interpreter)."""
    if version in SGLANG_GROUP_RELEASES:
        got = group_runs(version, tmp_path_factory).superlinear
        if isinstance(got, BaseException):
            raise got
        return got
    python = ensure_engine_python(f"sglang-{version}")
    if version in SGLANG_PROVED["superlinear-backend"]:
        python = private_install(python, tmp_path_factory.mktemp(f"sglang-{version}"))
    return superlinear_runs(version, python, lambda mode, **env: run(python, mode, **env))


def assert_drive(got: dict) -> dict:
    assert got["cli"] == "superlinear", got
    assert got["support_triton"] is False and got["positions"] == [3, 4, 0, 1, 2, 3], got
    assert got["factory"] == "toolkit.patches.sglang.superlinear.plugin", got
    assert got["extend_capture_refused"] and got["seq_len_fill_value"] == 1, got
    assert set(got["cases"]) == {"window_spans"} and set(got["cases"]["window_spans"]) == {"prompts", "chunks", "decode"}
    for key, error in got["cases"]["window_spans"].items():
        assert isinstance(error, float) and error <= 1e-5, (key, error)
    return got


@pytest.mark.parametrize("version", SGLANG_PROVED["superlinear-backend"])
def test_the_patch_selects_and_runs_the_backend(version, tmp_path_factory):
    got = runs(version, tmp_path_factory)
    if version == SGLANG_PROVED["superlinear-backend"][0]:  # the control: stock SGLang knows no such backend
        stock = got["stock"]
        assert stock["cli"] is None and stock["factory"] is None and stock["support_triton"] is True, stock
    assert_drive(got["patch"])
    assert got["after"] == got["before"]


@pytest.mark.parametrize("version", SGLANG_PROVED["superlinear-plugin"])
def test_the_plugin_selects_and_runs_the_backend(version, tmp_path_factory):
    assert_drive(runs(version, tmp_path_factory)["plugin"])
