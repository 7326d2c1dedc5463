"""Issue 49, "output and arguments": what the command line and the API do with a closed or full stdout,
a reader that closes the pipe, a signal under --json, code nested too deeply to parse, arguments of the
wrong type, paths naming no one's home, an empty matrix, a Ctrl-C during the interpreter probe and a
folder that must not be replaced.

Most cases run the real ``python -m toolkit`` entry point in a child process (the way a user runs it:
its own signal handlers, its own stdout), on the demo engine tree of ``tests/toolkit/demo_patches.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.toolkit import demo_patches
from toolkit import api, cli
from toolkit.errors import PatchError, UsageError
from toolkit.engine.sources import load_source

ROOT = Path(__file__).resolve().parents[2]

# The child: the demo registry, the demo tree as the installed engine (unless "-"), an optional hook
# (Python run first: a fault to inject), then the real console-script entry point.
CHILD = textwrap.dedent(
    """
    import sys
    from tests.toolkit import demo_patches
    from toolkit import api, patch_registry
    patch_registry.registry = lambda: [demo_patches.DEMO, demo_patches.SECOND]
    site = sys.argv.pop(1)
    if site != "-":
        from toolkit.engine.sources import load_source
        api.find_engines = lambda python=None: [load_source(site).as_installed()]
    exec(sys.argv.pop(1))
    sys.argv[0] = "toolkit"
    from toolkit.__main__ import run
    run()
    """
)


def child_argv(site: Path | None, *argv: str, hook: str = "") -> list[str]:
    return [sys.executable, "-c", CHILD, str(site) if site else "-", hook, *argv]


def toolkit(site: Path | None, *argv: str, hook: str = "", **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("stdout", subprocess.PIPE)
    return subprocess.run(child_argv(site, *argv, hook=hook), cwd=ROOT, stderr=subprocess.PIPE, text=True,
                          timeout=120, **kwargs)


def no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


@pytest.fixture
def site(tmp_path) -> Path:
    return demo_patches.make_engine_tree(tmp_path / "site")


def patched(site: Path) -> bool:
    return "toolkit:demo" in (site / "sglang/srt/serving.py").read_text()


def apply_demo(site: Path) -> None:
    proc = toolkit(site, "apply-patch", "--json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert patched(site)


# ---- stdout closed at start, a reader that closes the pipe, a full stdout


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_revert_with_stdout_closed_does_nothing_and_says_so(site, json_flag):
    """`toolkit revert >&-` reverted, then died on its first print (traceback, exit 1): now it refuses
    before writing anything, in one sentence on stderr, with 141 (stdout closed)."""
    apply_demo(site)
    proc = toolkit(site, "revert", *json_flag, preexec_fn=lambda: os.close(1), stdout=None)
    no_traceback(proc)
    assert proc.returncode == 141
    assert "stdout is closed" in one_line(proc.stderr) and "nothing was done" in proc.stderr
    assert patched(site)  # nothing reverted behind a report nobody could read


def test_quiet_revert_with_stdout_closed_runs(site):
    """-q prints nothing but errors: a closed stdout loses nothing, so the command runs."""
    apply_demo(site)
    proc = toolkit(site, "revert", "-q", preexec_fn=lambda: os.close(1), stdout=None)
    no_traceback(proc)
    assert proc.returncode == 0 and not patched(site)


def closed_pipe_run(site: Path | None, *argv: str) -> subprocess.CompletedProcess:
    """The command's stdout is a pipe whose reader is gone (`| head -1` once head has exited)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return toolkit(site, *argv, stdout=write_end)
    finally:
        os.close(write_end)


@pytest.mark.parametrize("argv", [["list", "-v"], ["list"], ["list", "--json"], ["status", "-v"], ["status", "--json"],
                                  ["apply-patch", "--dry-run", "--diff"], ["apply-patch", "--dry-run", "--json"]])
def test_a_closed_pipe_is_141_with_tables_and_json_alike(site, argv):
    """rich's broken-pipe handler exited 1 where --json exited 141: now 141 for any closed pipe."""
    proc = closed_pipe_run(site, *argv)
    no_traceback(proc)
    assert proc.returncode == 141, proc.stderr
    assert not patched(site)


@pytest.mark.parametrize("argv", [["list", "--json"], ["list"], ["status", "--json"], ["apply-patch", "--dry-run", "--json"]])
def test_a_full_stdout_is_one_sentence_and_exit_1(site, argv):
    with open("/dev/full", "w") as full:
        proc = toolkit(site, *argv, stdout=full)
    no_traceback(proc)
    assert proc.returncode == 1
    assert "cannot write to stdout" in one_line(proc.stderr) and "ENOSPC" in proc.stderr


def test_new_patch_json_into_a_full_stdout_says_the_folder_was_written(tmp_path):
    """new-patch wrote its folder, then its report failed: a chained OSError traceback before."""
    folder = tmp_path / "mine"
    with open("/dev/full", "w") as full:
        proc = toolkit(None, "new-patch", "my-fix", "--engine", "vllm", "--dir", str(folder), "--json", stdout=full)
    no_traceback(proc)
    assert proc.returncode == 1 and "what the command did is done" in one_line(proc.stderr)
    assert (folder / "pyproject.toml").is_file()


# ---- --json on SIGINT: still one object, saying what was committed

SIGNAL_AFTER_COMMIT = """
import os, signal
from toolkit.engine import state
write = state.StateDir.write_manifest
calls = []
def write_manifest(self, manifest):
    write(self, manifest)
    calls.append(1)
    if len(calls) == 2:  # the journal, then the final manifest: the commit
        os.kill(os.getpid(), signal.SIGINT)
state.StateDir.write_manifest = write_manifest
"""

SIGNAL_BEFORE_COMMIT = """
import os, signal
from toolkit.engine import journal
journal._after_file_write = lambda relpath: os.kill(os.getpid(), signal.SIGINT)
"""


def test_json_on_sigint_after_the_commit_reports_the_engine(site):
    proc = toolkit(site, "apply-patch", "--json", hook=SIGNAL_AFTER_COMMIT)
    no_traceback(proc)
    assert proc.returncode == 130
    payload = json.loads(proc.stdout)  # one object, nothing after it
    assert payload["ok"] is False and payload["interrupted"] is True and payload["kind"] == "interrupted"
    (engine,) = payload["engines"]
    assert engine["applied_patches"] == ["demo", "second"] and engine["changed_files"]
    assert patched(site)


def test_json_on_sigint_before_the_commit_reports_nothing_committed(site):
    proc = toolkit(site, "apply-patch", "--json", hook=SIGNAL_BEFORE_COMMIT)
    no_traceback(proc)
    assert proc.returncode == 130
    payload = json.loads(proc.stdout)
    assert payload["interrupted"] is True and payload["engines"] == [] and payload["ok"] is False
    assert not patched(site)


def test_without_json_sigint_is_still_one_word(site):
    proc = toolkit(site, "apply-patch", hook=SIGNAL_AFTER_COMMIT)
    assert proc.returncode == 130 and one_line(proc.stderr) == "interrupted"
    assert patched(site)


# ---- code nested too deeply to parse


@pytest.mark.parametrize("nesting", ["(" * 3000 + "1" + ")" * 3000, "+".join(["1"] * 2000), "not " * 5000 + "x",
                                     "x" + ".a" * 3000])
def test_check_source_on_code_nested_too_deeply(site, nesting):
    """3000 nested parentheses crashed libcst's native parser (SIGSEGV, exit 139, no output); 2000
    terms overflowed its Python recursion (`kind: internal`)."""
    serving = site / "sglang/srt/serving.py"
    serving.write_text(demo_patches.SERVING + f"\nDEEP = {nesting}\n")
    proc = toolkit(None, "check", "--source", str(site), "--json")
    no_traceback(proc)
    assert proc.returncode == 1, proc.stderr
    payload = json.loads(proc.stdout)
    errors = [e for p in payload["patches"] for e in p["errors"]]
    assert payload["ok"] is False and any("nested too deeply" in e and "srt/serving.py" in e for e in errors), errors
    proc = toolkit(site, "apply-patch")
    assert proc.returncode == 1 and "nested too deeply" in one_line(proc.stderr)
    assert "toolkit:" not in serving.read_text()


# ---- the API's arguments


@pytest.fixture
def api_site(site, monkeypatch):
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [demo_patches.DEMO, demo_patches.SECOND])
    seen = []

    def find_engines(python=None):
        seen.append(python)
        return [load_source(site).as_installed()]

    monkeypatch.setattr(api, "find_engines", find_engines)
    return site, seen


def test_api_takes_a_path_for_python(api_site):
    site, seen = api_site
    assert api.apply_patch(python=Path(sys.executable)) is True
    assert seen[-1] == sys.executable and isinstance(seen[-1], str)
    assert api.revert_patch(python=Path(sys.executable)) is True
    assert isinstance(api.patch_status(python=Path(sys.executable)), list)


@pytest.mark.parametrize("call, kwargs, words", [
    (api.apply_patch, {"patches": [None]}, "patches must be a list of patch ids"),
    (api.apply_patch, {"patches": ["demo", 3]}, "3 is not one"),
    (api.apply_patch, {"patches": 7}, "patches must be a list of patch ids"),
    (api.revert_patch, {"engine": []}, "engine must be"),
    (api.revert_patch, {"engine": 1}, "engine must be"),
    (api.patch_status, {"engine": {"vllm"}}, "engine must be"),
    (api.apply_patch, {"python": 3}, "python must be a path"),
    (api.revert_patch, {"python": b"/usr/bin/python3"}, "python must be a path"),
    (api.repair_engines, {"engine": ["vllm"]}, "engine must be"),
])
def test_api_arguments_of_the_wrong_type_are_usage_errors(api_site, call, kwargs, words):
    site, _ = api_site
    with pytest.raises(UsageError, match=words):
        call(**kwargs)
    assert not patched(site)


ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=6),
                     st.binary(max_size=4), st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=4)), max_size=3),
                     st.dictionaries(st.text(max_size=2), st.integers(), max_size=1), st.just(Path("/usr/bin/python3")),
                     st.sampled_from(["vllm", "sglang", "demo", "second"]), st.just(["demo"]))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(engine=ANY_VALUE, patches=ANY_VALUE, python=ANY_VALUE)
def test_api_arguments_of_any_type_are_a_result_or_a_patch_error(api_site, engine, patches, python):
    """The adversary loop that found the AttributeError/TypeError: any value in any argument."""
    for call in (api.apply_patch, api.revert_patch):
        try:
            call(engine=engine, patches=patches, python=python)
        except PatchError:
            pass
    try:
        api.patch_status(engine=engine, python=python)
    except PatchError:
        pass


NESTINGS = ["(", "[", "{", "not ", "-", "~", "lambda: ", "await ", "f(", "x[", "a if b else "]
CLOSING = {"(": ")", "[": "]", "{": "}", "f(": ")", "x[": "]"}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(pattern=st.lists(st.sampled_from(NESTINGS), min_size=1, max_size=4), depth=st.integers(300, 4000))
def test_check_source_on_any_deep_nesting_never_crashes(tmp_path_factory, pattern, depth):
    """Random mixes of nesting, in process: a crash inside libcst would end this very test run."""
    from toolkit import patch_registry
    from toolkit.engine.check import check_source

    levels = (pattern * depth)[:depth]
    site = demo_patches.make_engine_tree(tmp_path_factory.mktemp("deep"))
    expression = "".join(levels) + "1" + "".join(CLOSING.get(level, "") for level in reversed(levels))
    (site / "sglang/srt/serving.py").write_text(demo_patches.SERVING + f"\nDEEP = {expression}\n")
    registry = patch_registry.registry
    patch_registry.registry = lambda: [demo_patches.DEMO, demo_patches.SECOND]
    try:
        checks = check_source(load_source(site))
    finally:
        patch_registry.registry = registry
    for check in checks:  # parsed and walked, or one sentence saying why not
        assert check.ok or all("srt/serving.py" in e for e in check.errors), check.errors


# ---- paths naming a home folder that does not exist


def test_a_home_folder_that_does_not_exist_is_a_usage_error(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TOOLKIT_CACHE_DIR", "~nosuchuser/c")
    for argv in (["matrix", "--offline", "--json"], ["new-patch", "my-fix", "--engine", "vllm", "--dir",
                                                      "~nosuchuser/x", "--json"]):
        code = cli.main(argv)
        payload = json.loads(capsys.readouterr().out)
        assert code == 2 and payload["kind"] == "usage", payload
        assert "~nosuchuser" in payload["error"] and "internal error" not in payload["error"]
    assert list(tmp_path.iterdir()) == []


# ---- matrix --offline on an empty cache


def test_matrix_offline_on_an_empty_cache_is_not_ok(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TOOLKIT_CACHE_DIR", str(tmp_path / "empty"))
    code = cli.main(["matrix", "--offline", "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 1 and payload["ok"] is False and payload["cells"] == []
    assert "nothing was checked" in payload["problems"][0]
    code = cli.main(["matrix", "--offline"])
    assert code == 1 and "nothing was checked" in capsys.readouterr().out


# ---- Ctrl-C during the --python probe


def _gone(pid: int) -> bool:
    """Ended (a zombie counts: a container's init may never reap the orphan)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status or "\nState:\tX" in status


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_the_probe_kills_the_probe(tmp_path, signum):
    pid_file = tmp_path / "probe.pid"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\necho $$ > {pid_file}.tmp && mv {pid_file}.tmp {pid_file}\nexec sleep 300\n")
    fake.chmod(0o755)
    proc = subprocess.Popen(child_argv(None, "status", "--python", str(fake), "--json"), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        for _ in range(600):
            if pid_file.exists():
                break
            time.sleep(0.05)
        probe = int(pid_file.read_text())
        proc.send_signal(signum)
        proc.communicate(timeout=60)
        for _ in range(100):
            if _gone(probe):
                break
            time.sleep(0.05)
        assert _gone(probe), "the probe outlived the command"
    finally:
        proc.kill()
        proc.communicate()
        if pid_file.exists() and not _gone(int(pid_file.read_text())):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    assert proc.returncode in (130, -signal.SIGTERM)


# ---- new-patch never replaces an existing folder


def test_new_patch_into_the_current_folder_keeps_it(tmp_path, monkeypatch, capsys):
    """`new-patch --dir .` renamed its staging folder onto the current one: the shell was left in a
    deleted folder. An existing empty folder is now filled in place; a non-empty one is refused."""
    here = tmp_path / "here"
    here.mkdir()
    here.chmod(0o750)
    inode = here.stat().st_ino
    monkeypatch.chdir(here)
    assert cli.main(["new-patch", "my-fix", "--engine", "vllm", "--dir", "."]) == 0
    assert here.stat().st_ino == inode and (here.stat().st_mode & 0o777) == 0o750
    assert (here / "pyproject.toml").is_file() and not [p for p in here.iterdir() if p.name.startswith(".")]
    assert Path.cwd() == here and os.path.samefile(".", here)
    capsys.readouterr()
    assert cli.main(["new-patch", "my-fix", "--engine", "vllm", "--dir", "."]) == 2
    assert "is not empty" in one_line(capsys.readouterr().err)


# ---- wording: a deleted file, a file the release does not have, "editable": "true"


def test_a_deleted_file_is_called_deleted_not_changed(api_site, capsys):
    site, _ = api_site
    assert api.apply_patch() is True
    (site / "sglang/srt/protocol.py").unlink()
    rows = {row.patch_id: row for row in api.patch_status()}
    assert rows["demo"].state == "drifted"
    assert rows["demo"].detail == "deleted since patched: srt/protocol.py", rows["demo"].detail
    code = cli.main(["revert", "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert code == 1 and payload["kind"] == "drift" and payload["files"] == ["srt/protocol.py"]
    assert "deleted since patched: srt/protocol.py" in payload["error"] and "changed since" not in payload["error"]


def test_repair_says_nothing_of_files_the_release_does_not_have(tmp_path, monkeypatch, capsys):
    """A patch that edits srt/absent.py on other releases: repair called it "not in pip's RECORD"."""
    from toolkit.codemod import FileEdit, Patch

    elsewhere = Patch(id="elsewhere", engine="sglang", versions=">=0.5,<1", summary="edits a file of older releases",
                      files=(FileEdit("srt/absent.py", (demo_patches.AddOtherComment,), versions="<0.5.1"),))
    stray = Patch(id="stray", engine="sglang", versions=">=0.5,<1", summary="edits a file pip did not install",
                  files=(FileEdit("srt/stray.py", (demo_patches.AddOtherComment,), versions="<0.5.1"),))
    site = demo_patches.make_engine_tree(tmp_path / "site")
    demo_patches.write_record(site)
    (site / "sglang/srt/stray.py").write_text("x = 1\n")  # on disk, not in RECORD: still said
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [demo_patches.DEMO, elsewhere, stray])
    monkeypatch.setattr(api, "find_engines", lambda python=None: [load_source(site).as_installed()])
    monkeypatch.setattr("toolkit.engine.discovery.site_dirs", lambda python=None: [site])
    assert api.apply_patch(patches=["demo"]) is True
    assert cli.main(["repair"]) == 0
    out = capsys.readouterr().out
    assert "srt/absent.py" not in out
    assert "srt/stray.py: not in pip's RECORD, left as it is" in out


@pytest.mark.parametrize("editable, kind", [(True, "editable"), ("true", "editable"), ("True", "editable"),
                                            (False, "directory"), ("false", "directory"), (None, "directory")])
def test_direct_url_editable_as_a_string_is_read_as_editable(tmp_path, editable, kind):
    """PEP 610 says a boolean; a string "true" was read as a plain directory install, which apply-patch
    patches without --allow-editable: it now reads as editable (the safe side)."""
    from importlib.metadata import PathDistribution

    from toolkit.engine.discovery import install_kind

    site = demo_patches.make_engine_tree(tmp_path / "site")
    dist_info = site / "sglang-0.5.9.dist-info"
    dir_info = {} if editable is None else {"editable": editable}
    (dist_info / "direct_url.json").write_text(json.dumps({"url": "file:///src/sglang", "dir_info": dir_info}))
    assert install_kind(PathDistribution(dist_info)) == kind


# ---- a corrupt cached wheel


def _wheel_of(tree: Path, wheel: Path) -> Path:
    import zipfile

    with zipfile.ZipFile(wheel, "w") as archive:
        for path in sorted(tree.rglob("*")):
            if path.is_file():
                archive.write(path, str(path.relative_to(tree)))
    return wheel


@pytest.fixture
def lost_backups(tmp_path, monkeypatch):
    """A patched demo engine whose backups are gone: repair needs the release wheel."""
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [demo_patches.DEMO, demo_patches.SECOND])
    release = demo_patches.make_engine_tree(tmp_path / "release")
    demo_patches.write_record(release)
    import shutil

    site = tmp_path / "site"
    shutil.copytree(release, site)
    monkeypatch.setattr(api, "find_engines", lambda python=None: [load_source(site).as_installed()])
    monkeypatch.setattr("toolkit.engine.discovery.site_dirs", lambda python=None: [site])
    assert api.apply_patch() is True
    shutil.rmtree(site / ".toolkit-state/sglang/backups")
    cache = tmp_path / "cache"
    monkeypatch.setenv("TOOLKIT_CACHE_DIR", str(cache))
    (cache / "wheels").mkdir(parents=True)
    return site, release, cache / "wheels"


WHEEL_NAME = "sglang-0.5.9-py3-none-any.whl"


def test_a_corrupt_cached_wheel_is_dropped_and_downloaded_again(lost_backups, tmp_path):
    site, release, wheels = lost_backups
    good = _wheel_of(release, tmp_path / WHEEL_NAME)
    cut_short = good.read_bytes()[: len(good.read_bytes()) // 2]
    (wheels / WHEEL_NAME).write_bytes(cut_short)
    # stands in for `python -m pip download ... -d DIR SPEC` (no index here): puts the good wheel in DIR
    pip = tmp_path / "python"
    pip.write_text(f'#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = "-d" ] && cp {good} "$2/"; shift; done\n')
    pip.chmod(0o755)
    from toolkit.engine.repair import pip_download, repair

    result = repair(load_source(site).as_installed(), pip_download(str(pip)))
    assert set(result.restored.values()) == {"release"}
    assert not patched(site) and (wheels / WHEEL_NAME).read_bytes() == good.read_bytes()


def test_a_cached_wheel_that_differs_from_record_is_named(lost_backups, tmp_path, capsys, monkeypatch):
    site, release, wheels = lost_backups
    (release / "sglang/srt/serving.py").write_text("# not the release\n")  # a whole zip, wrong bytes
    _wheel_of(release, wheels / WHEEL_NAME)
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")  # no download is tried: the cache has one
    assert cli.main(["repair"]) == 1
    err = capsys.readouterr().err
    assert str(wheels / WHEEL_NAME) in err and "delete it and run repair again" in err
    assert patched(site)
