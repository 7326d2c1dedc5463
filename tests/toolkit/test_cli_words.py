"""What a new user trips over (issue 29): --python given as a relative path or a venv's folder, an
interpreter that hangs, the Python API's empty and impossible requests, tracebacks on a closed pipe or
an early Ctrl-C, wrong or missing words in messages and help, skipped patches nobody named, ids cut
in narrow tables, JSON outputs of different shapes, -q and -v."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from rich.console import Console

from toolkit import api, cli
from toolkit.base.version import __version__
from toolkit.cli import output as cli_output
from toolkit.engine.discovery import find_engines, site_dirs
from toolkit.errors import UsageError
from toolkit.verify.checks import NAMES
from toolkit.engine.sources import load_source

from tests.toolkit import demo_patches
from tests.toolkit.test_bad_input import one_sentence as one_line, run

REPO = Path(__file__).resolve().parents[2]
OLD = dataclasses.replace(demo_patches.SECOND, id="old-only", versions=">=0.4,<0.5")
BUILTIN = dataclasses.replace(demo_patches.SECOND, id="built-in", versions=">=0.4,<0.5.9",
                              not_needed=(">=0.5.9", "the engine serves this itself through a plugin"))
VLLM_ONLY = dataclasses.replace(demo_patches.SECOND, id="vllm-only", engine="vllm")


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [demo_patches.DEMO, demo_patches.SECOND, OLD, BUILTIN, VLLM_ONLY])
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A demo SGLang 0.5.9 tree that the CLI and the API find as this interpreter's install."""
    site = demo_patches.make_engine_tree(tmp_path / "site")
    monkeypatch.setattr(api, "find_engines", lambda python=None: [load_source(site).as_installed()])
    return site


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A bare venv holding a stand-in SGLang 0.5.23 distribution."""
    root = tmp_path_factory.mktemp("words") / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    purelib = subprocess.run([str(root / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    demo_patches.make_engine_tree(Path(purelib), version="0.5.23")
    return root


# 1. --python relative, or a venv's folder

def test_python_relative_path_and_venv_folder(venv, monkeypatch, capsys):
    monkeypatch.chdir(venv.parent)
    for given in ("venv/bin/python", "./venv/bin/python", "venv", "./venv/"):
        (found,) = find_engines(given)
        assert (found.engine, found.version) == ("sglang", "0.5.23"), given
        code, out, _ = run(capsys, "status", "--python", given, "--json")
        assert code == 0 and {r["patch_id"] for r in json.loads(out)["patches"]} >= {"demo", "built-in"}, given
    assert [str(p) for p in site_dirs("venv")] == [str(p) for p in site_dirs(str(venv / "bin/python"))] != []
    (venv.parent / "empty").mkdir(exist_ok=True)
    code, _, err = run(capsys, "status", "--python", "empty")
    assert code == 2 and "empty is a folder without bin/python" in one_line(err)


# 2. an interpreter that hangs

def test_an_interpreter_that_hangs_is_one_sentence_within_the_probe_timeout(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "hangs"
    fake.write_text("#!/bin/sh\nsleep 60\n")  # its child `sleep` holds the pipes: the whole group must go
    fake.chmod(0o755)
    monkeypatch.setenv("TOOLKIT_PROBE_TIMEOUT", "1")
    started = time.monotonic()
    code, _, err = run(capsys, "status", "--python", str(fake))
    line = one_line(err)
    assert code == 2 and str(fake) in line and "within 1 s" in line and "TOOLKIT_PROBE_TIMEOUT" in line
    assert "import" not in line and "find_engines_here" not in line  # never the probe's source
    for call in (lambda: find_engines(str(fake)), lambda: site_dirs(str(fake))):
        with pytest.raises(UsageError, match="did not answer as a Python interpreter within 1 s"):
            call()
    assert time.monotonic() - started < 20
    monkeypatch.setenv("TOOLKIT_PROBE_TIMEOUT", "soon")
    code, _, err = run(capsys, "status", "--python", str(fake))
    assert code == 2 and "TOOLKIT_PROBE_TIMEOUT must be a number of seconds" in one_line(err)


# 3. the Python API

def test_api_refuses_what_it_cannot_do_and_names_keywords_not_flags(site, monkeypatch):
    for call in (api.apply_patch, api.revert_patch):
        with pytest.raises(UsageError, match=r"patches=\[\] names no patch; pass patches=None"):
            call(patches=[])
        with pytest.raises(UsageError, match="vLLM is not installed for .*pass python="):
            call("vllm")
        with pytest.raises(UsageError, match="vLLM is not installed"):
            call(patches=["vllm-only"])
        for bad in (float("nan"), -1, float("inf"), "5", True):
            with pytest.raises(UsageError, match="lock_timeout must be a finite number >= 0") as info:
                call(lock_timeout=bad)
            assert "--" not in str(info.value)
    with pytest.raises(UsageError, match="lock_timeout"):
        api.repair_engines(lock_timeout=float("nan"))
    with pytest.raises(UsageError, match="did you mean demo"):
        api.apply_patch(patches=["dmeo"])
    with pytest.raises(UsageError, match="did you mean sglang"):
        api.apply_patch("sglnag")
    assert api.apply_patch(patches=["demo"]) is True and api.revert_patch() is True
    monkeypatch.setattr(api, "find_engines", lambda python=None: [])
    with pytest.raises(UsageError, match="vLLM or SGLang is not installed") as info:
        api.apply_patch()
    assert "--python" not in str(info.value)


# 4. no traceback on a closed pipe, an early Ctrl-C, TOOLKIT_DEBUG=0

@pytest.mark.parametrize("argv", [["list"], ["list", "--json"]])  # rich's writes, then print's buffer at exit
def test_closed_stdout_exits_quietly(argv):
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first byte, as with `| head -0`
    try:
        proc = subprocess.run([sys.executable, "-m", "toolkit", *argv], stdout=write,
                              stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode in (1, 141) and proc.stderr == "", proc.stderr


def test_ctrl_c_while_the_command_line_loads_says_interrupted():
    """A real SIGINT, sent while rich is being imported (before main()'s try)."""
    code = textwrap.dedent("""\
        import os, signal, sys
        class Interrupt:
            def find_spec(self, name, path=None, target=None):
                if name == "rich":
                    os.kill(os.getpid(), signal.SIGINT)
                return None
        sys.meta_path.insert(0, Interrupt())
        sys.argv = ["toolkit", "list"]
        from toolkit.__main__ import run
        run()
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert (proc.returncode, proc.stderr.strip(), proc.stdout) == (130, "interrupted", ""), proc.stderr


@pytest.mark.parametrize("value", ["0", "no", "false", "off", "", "FALSE"])
def test_toolkit_debug_off_values_keep_tracebacks_off(value, monkeypatch, capsys):
    def bug(args, console):
        raise RuntimeError("a bug")

    monkeypatch.setitem(cli.COMMANDS, "list", bug)  # a stand-in bug: no real command has a known one
    monkeypatch.setenv("TOOLKIT_DEBUG", value)
    code, _, err = run(capsys, "list")
    assert code == 1 and "internal error (RuntimeError: a bug)" in one_line(err)
    monkeypatch.setenv("TOOLKIT_DEBUG", "yes")
    with pytest.raises(RuntimeError):
        cli.main(["list"])


# 5. words

def test_usage_errors_name_the_right_help_and_a_near_miss(site, capsys):
    cases = {("aply-patch",): "did you mean apply-patch? (see `toolkit --help`)",
             ("apply-patch", "--forse"): "did you mean --force? (see `toolkit apply-patch --help`)",
             ("status", "sglnag"): "did you mean sglang? (see `toolkit status --help`)",
             ("verify", "--model", "m", "--engine", "vlm"): "did you mean vllm?"}
    for argv, words in cases.items():
        code, _, err = run(capsys, *argv)
        assert code == 2 and words in err and "toolkit toolkit" not in err, (argv, err)
    code, _, err = run(capsys, "apply-patch", "--patch", "dmeo")
    assert code == 2 and "unknown patch: dmeo; did you mean demo?" in one_line(err)
    code, _, err = run(capsys, "verify", "--model", "m", "--checks", "stream-parit")
    assert code == 2 and "did you mean stream-parity?" in one_line(err)


def test_a_patch_of_an_engine_not_installed_names_that_engine(site, capsys):
    code, _, err = run(capsys, "apply-patch", "--patch", "vllm-only")
    line = one_line(err)
    assert code == 2 and "vLLM is not installed" in line and "SGLang" not in line and "--python PATH" in line


def test_apply_names_what_it_skipped_and_dry_run_and_revert_say_what_they_mean(site, capsys):
    code, out, _ = run(capsys, "apply-patch", "--dry-run")
    assert code == 0 and "would change 2 file(s); would leave applied: demo, second" in out and "applied now" not in out
    assert "skipped (not proved on sglang 0.5.9): old-only" in out
    assert "not needed on sglang 0.5.9: built-in (the engine serves this itself through a plugin)" in out
    code, out, _ = run(capsys, "apply-patch", "--json")
    skipped = json.loads(out)["engines"][0]["skipped_patches"]
    assert {(s["patch"], s["reason"]) for s in skipped} == {("old-only", "not proved"), ("built-in", "not needed")}
    code, out, _ = run(capsys, "revert", "--patch", "second", "--dry-run")
    assert code == 0 and "would revert, changing 1 file(s); would leave applied: demo" in out
    code, out, _ = run(capsys, "revert")
    assert code == 0 and "reverted, changed 2 file(s); still applied: none" in out and "applied now" not in out
    code, out, _ = run(capsys, "revert")
    assert code == 0 and "nothing to revert (still applied: none)" in out


def test_status_says_not_needed_with_the_reason(site, capsys):
    code, out, _ = run(capsys, "status")
    built_in = next(line for line in out.splitlines() if "built-in" in line)
    assert "not needed" in built_in and "plugin" in built_in and "allow-unknown-version" not in built_in
    old = next(line for line in out.splitlines() if "old-only" in line)
    assert "not applied" in old and "version not proved" in old
    code, out, _ = run(capsys, "status", "--json")
    rows = {r["patch_id"]: r for r in json.loads(out)["patches"]}
    assert rows["built-in"]["not_needed"].startswith("the engine serves") and rows["demo"]["not_needed"] == ""


def test_help_says_what_each_option_is_for(capsys):
    for command, option in (("apply-patch", "--lock-timeout"), ("revert", "--lock-timeout"), ("repair", "--lock-timeout"),
                            ("verify", "--model"), ("check", "--patch")):
        action = next(a for a in cli.build_parser()._subparsers._group_actions[0].choices[command]._actions
                      if option in a.option_strings)
        assert action.help, (command, option)
    code, out, _ = run(capsys, "verify", "--help")
    assert code == 0 and all(name in " ".join(out.split()) for name in NAMES)


def test_the_static_check_names_are_every_check():
    """``verify --checks`` help lists the names without importing the checks: the list stays true."""
    code = "from toolkit.verify.checks import all_checks; print(' '.join(c.name for c in all_checks()))"
    names = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True).stdout
    assert tuple(names.split()) == NAMES


# 6. output

def test_patch_ids_are_never_cut_in_a_narrow_pipe(venv):
    env = {**os.environ, "COLUMNS": "60"}
    listed = subprocess.run([sys.executable, "-m", "toolkit", "list"], capture_output=True, text=True, cwd=REPO,
                            env=env, check=True).stdout
    ids = json.loads(subprocess.run([sys.executable, "-m", "toolkit", "list", "--json"], capture_output=True,
                                    text=True, cwd=REPO, check=True).stdout)["patches"]
    cells = {cell.strip() for line in listed.splitlines() for cell in line.split("│")}
    assert {p["id"] for p in ids} <= cells, listed
    status = subprocess.run([sys.executable, "-m", "toolkit", "status", "--python", str(venv)], capture_output=True,
                            text=True, cwd=REPO, env=env)
    cells = {cell.strip() for line in status.stdout.splitlines() for cell in line.split("│")}
    assert {p["id"] for p in ids if p["engine"] == "sglang"} <= cells, status.stdout + status.stderr
    superlinear = next(line for line in status.stdout.splitlines() if "superlinear-backend" in line)
    assert "not needed" in superlinear  # SGLang 0.5.23 loads the backend from our plugin entry point


def test_every_json_output_is_one_object_with_a_schema(site, monkeypatch, capsys):
    code, out, _ = run(capsys, "--version", "--json")
    assert code == 0 and json.loads(out) == {"schema": 1, "ok": True, "name": "serving-toolkit",
                                             "version": __version__}
    demo_patches.write_record(site)
    for argv in (["list"], ["status"], ["apply-patch"], ["revert"], ["repair"], ["check", "--source", str(site)],
                 ["apply-patch", "--patch", "nope"], ["revert", "--lock-timeout", "-1"], ["status", "--python", "/dev"]):
        code, out, _ = run(capsys, *argv, "--json")
        payload = json.loads(out)
        assert payload["schema"] == 1 and payload["ok"] is (code == 0), (argv, payload)
        assert payload.get("kind") == ("usage" if code == 2 else None), argv
    monkeypatch.setattr(api, "find_engines", lambda python=None: [])
    code, out, _ = run(capsys, "status", "--json")
    assert code == 0 and json.loads(out) == {"schema": 1, "ok": True, "patches": []}


def test_quiet_and_verbose_on_every_command(site, capsys):
    demo_patches.write_record(site)
    package = str(site / "sglang")
    quiet = [["list"], ["apply-patch"], ["status"], ["revert"], ["repair"], ["check", "--source", str(site)]]
    for argv in quiet:
        code, out, err = run(capsys, *argv, "-q")
        assert (code, out, err) == (0, "", ""), argv
    code, out, err = run(capsys, "apply-patch", "--patch", "nope", "--quiet")
    assert code == 2 and out == "" and "unknown patch" in err  # errors still show
    code, out, err = run(capsys, "verify", "--model", "m", "--checks", "nope", "-q")
    assert code == 2 and out == "" and "unknown check" in err
    assert "runtime modules" in run(capsys, "list", "-v")[1]
    assert package in run(capsys, "apply-patch", "-v")[1]
    out = run(capsys, "status", "-v")[1]
    assert "srt/serving.py: patched" in out and package in out
    assert "srt/serving.py: patched" not in run(capsys, "status")[1]
    assert package in run(capsys, "revert", "--verbose")[1]
    assert package in run(capsys, "repair", "-v")[1]
    assert "anchors found" in run(capsys, "check", "--source", str(site), "-v")[1]
    assert run(capsys, "status", "-q", "-v")[0] == 2  # one or the other


def test_verify_report_verbose_names_the_server_and_patches():
    from toolkit.verify.checks import CheckResult
    from toolkit.verify.run import VerifyReport

    report = VerifyReport("vllm", "0.32.0", "tiny", "http://127.0.0.1:8000", ["tito"],
                          results=[CheckResult("stream-parity", "pass", "same ids")])
    for verbose in (False, True):
        console = Console(file=io.StringIO(), width=200)
        cli_output.print_verify(console, report, verbose)
        text = console.file.getvalue()
        assert "stream-parity" in text and "verdict: pass" in text
        assert ("server: http://127.0.0.1:8000; applied patches: tito" in text) is verbose


def test_every_command_the_docs_show_parses():
    """A `toolkit ...` example in the README or the docs that the parser refuses is a wrong word too."""
    texts = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    shown = {m for path in texts for m in re_commands(path.read_text())}
    assert len(shown) > 10
    wrong = []
    for text in sorted(shown):
        words = text.split()
        if len(words) < 3 or words[-1].startswith("--") or any(c in text for c in "[]|/<"):
            continue  # a usage line with placeholders, or an option named in passing
        try:
            cli.build_parser().parse_args(words[1:])
        except SystemExit:
            wrong.append(text)
    assert wrong == []


def re_commands(text: str) -> list[str]:
    import re

    return re.findall(r"`(toolkit (?:list|apply-patch|revert|status|repair|check|verify)[^`]*)`", text)


@pytest.mark.parametrize("model,words", [
    ("/nonexistent", "not found: pass a model folder"),
    ("./no-such-model", "not found: pass a model folder"),
    ("not a repo id", "neither a folder nor a Hugging Face model id"),
])
def test_verify_with_a_model_that_is_not_one_is_a_usage_error(model, words, monkeypatch, capsys):
    """Was "internal error (HFValidationError ...)"; checked before any server starts."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cli.main(["verify", "--model", model, "--url", "http://127.0.0.1:9"]) == 2
    assert words in one_line(capsys.readouterr().err)


def test_ctrl_c_while_python_shuts_down_after_the_command_prints_nothing():
    """A Ctrl-C that lands after the command finished, while the interpreter shuts down, printed
    "Exception ignored in: <module 'threading'> ... KeyboardInterrupt" (scripts/interrupt_loop.py found
    it); now the process ends at once with 130 and one word. The signal comes from an atexit callback,
    the last moment of shutdown a test can reach."""
    script = ("import atexit, os, signal, sys; "
              "atexit.register(lambda: os.kill(os.getpid(), signal.SIGINT)); "
              "sys.argv = ['toolkit', '--version']; from toolkit.__main__ import run; run()")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 130 and proc.stderr == "interrupted\n", (proc.returncode, proc.stderr)
    assert proc.stdout.startswith("toolkit ")


def test_ctrl_c_inside_an_import_ends_the_command_instead_of_being_swallowed():
    """KeyboardInterrupt raised in a weakref callback of the import machinery was only reported
    ("Exception ignored in: <function _get_module_lock.<locals>.cb>") and the command went on to its end
    (scripts/interrupt_loop.py found it). A SIGINT sent from a finalizer during an import now ends the
    process at once, 130, "interrupted", before the command runs."""
    hook = ("import os, signal, sys\n"
            "class Collected:\n"  # Python only reports what a finalizer raises, as in that callback
            "    def __del__(self): os.kill(os.getpid(), signal.SIGINT)\n"
            "class Finder:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'rich': Collected()\n"
            "sys.meta_path.insert(0, Finder())\n")
    script = hook + "sys.argv = ['toolkit', 'list', '--json']\nfrom toolkit.__main__ import run\nrun()\n"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert (proc.returncode, proc.stderr) == (130, "interrupted\n"), (proc.returncode, proc.stderr)
    payload = json.loads(proc.stdout)  # --json: the one object even this early (issue 57)
    assert payload["ok"] is False and payload["kind"] == "interrupted" and "patches" not in payload
