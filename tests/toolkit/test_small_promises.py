"""Issue 57's small items: bytecode under PYTHONPYCACHEPREFIX, a NUL byte or a 15 MB file in a source,
``check --source ''``, ``--python '~nosuchuser/...'``, ``--version >&-`` and ``status | head -1``."""

from __future__ import annotations

import json
import os
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import by_id
from tests.toolkit import demo_patches
from tests.toolkit.test_output_and_arguments import ROOT, no_traceback, toolkit
from toolkit import cli
from toolkit.engine import patching as engine
from toolkit.engine.sources import load_source

pytestmark = pytest.mark.usefixtures("demo_registry")
PROTOCOL = "sglang/srt/protocol.py"


def _run_optimised(site: Path, prefix: Path) -> bool:
    """Whether ``python -O`` with ``PYTHONPYCACHEPREFIX`` importing the demo protocol module runs the patched
    code (a real process; it writes no bytecode of its own)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=str(site), PYTHONPYCACHEPREFIX=str(prefix), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, "-O", "-c", "import sglang.srt.protocol as p; "
                           "print(hasattr(p.Response, 'token_ids'))"],
                          cwd=site, env=env, capture_output=True, text=True, check=True, timeout=60)
    return proc.stdout.strip() == "True"


@pytest.mark.parametrize("step", ["apply", "revert"])
def test_bytecode_under_the_pycache_prefix_goes_too(tmp_path, monkeypatch, step):
    """With PYTHONPYCACHEPREFIX the bytecode is in the prefix's mirror of the source's folder, not in
    __pycache__: an unchecked-hash .opt-1.pyc there made `python -O` run the release after apply."""
    site = demo_patches.make_engine_tree(tmp_path / "site")
    prefix = tmp_path / "prefix"
    installed = load_source(site).as_installed()
    if step == "revert":
        by_id.apply(installed, ["demo"])
    monkeypatch.setattr(sys, "pycache_prefix", str(prefix))  # what PYTHONPYCACHEPREFIX sets, for toolkit too
    source = site / PROTOCOL
    import importlib.util

    cfile = Path(importlib.util.cache_from_source(str(source), optimization=1))
    assert cfile.is_relative_to(prefix)
    py_compile.compile(str(source), cfile=str(cfile), doraise=True, optimize=1,
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    before = _run_optimised(site, prefix)
    assert before is (step == "revert")  # the cached code runs, whatever the source says
    by_id.apply(installed, ["demo"]) if step == "apply" else engine.revert(installed)
    assert not cfile.exists()
    assert _run_optimised(site, prefix) is (step == "apply")


def _check(site: Path) -> dict:
    from toolkit.engine.check import check_source

    checks = check_source(load_source(site), [demo_patches.DEMO])
    return {c.patch_id: c.errors for c in checks}


def test_a_nul_byte_is_one_sentence_with_its_line(tmp_path):
    site = demo_patches.make_engine_tree(tmp_path / "site")
    serving = site / "sglang/srt/serving.py"
    lines = serving.read_text().splitlines(keepends=True)
    lines[4] = lines[4].replace("def", "d\0ef")
    serving.write_text("".join(lines))
    (error,) = _check(site)["demo"]
    assert "\n" not in error and "a NUL byte at line 5, column 6" in error, error


def test_a_syntax_error_is_one_sentence_with_its_line(tmp_path):
    site = demo_patches.make_engine_tree(tmp_path / "site")
    serving = site / "sglang/srt/serving.py"
    serving.write_text(serving.read_text() + "\ndef broken(:\n")
    (error,) = _check(site)["demo"]
    assert "\n" not in error and "at line 8" in error, error


def test_a_15_mb_engine_file_is_refused_before_parsing(tmp_path):
    """It ran over 120 s (libcst); now a sentence, at once (no wall-clock assertion: the test's own
    timeout is the bound)."""
    site = demo_patches.make_engine_tree(tmp_path / "site")
    serving = site / "sglang/srt/serving.py"
    serving.write_text(serving.read_text() + "x = 1\n" * 2_500_000)
    (error,) = _check(site)["demo"]
    assert "holds 15,000,118 characters" in error and "more than the 4,000,000" in error and "\n" not in error, error


def test_check_source_empty_is_a_usage_error(tmp_path, monkeypatch, capsys):
    """`check --source ''` read the working directory as the tree."""
    monkeypatch.chdir(demo_patches.make_engine_tree(tmp_path / "site"))
    assert cli.main(["check", "--source", "", "--json"]) == 2
    payload = json.loads(capsys.readouterr().out)
    assert payload["kind"] == "usage" and payload["error"] == "'' is not a path to a wheel or an engine tree"


def test_python_of_a_user_who_does_not_exist_is_reported_as_given(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["status", "--python", "~nosuchuser57/bin/python", "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error.startswith("interpreter not found: ~nosuchuser57/bin/python") and str(tmp_path) not in error, error


def test_version_with_stdout_closed_is_141_as_every_command():
    for argv in (["--version"], ["--version", "--json"]):
        proc = subprocess.run([sys.executable, "-m", "toolkit", *argv], cwd=ROOT, stdout=None, stderr=subprocess.PIPE,
                              text=True, timeout=120, preexec_fn=lambda: os.close(1))
        no_traceback(proc)
        assert proc.returncode == 141 and "stdout is closed" in proc.stderr, (argv, proc.returncode, proc.stderr)


def test_status_into_a_reader_that_keeps_reading_is_the_commands_own_exit(tmp_path):
    """README: `toolkit status | head -1` is the command's own exit when all of its output fits in the pipe
    before head closes it (the shell's usual rule: `ls | head -1` too), 141 only when a write finds the
    reader gone (tests/toolkit/test_output_and_arguments.py::test_a_closed_pipe_is_141_with_tables_and_json_alike)."""
    site = demo_patches.make_engine_tree(tmp_path / "site")
    proc = toolkit(site, "status")  # stdout: a pipe read to its end
    no_traceback(proc)
    assert proc.returncode == 0 and len(proc.stdout.splitlines()) > 1
