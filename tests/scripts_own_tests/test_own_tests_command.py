"""``toolkit own-tests`` as an adversary would run it (issue 57): Ctrl-C and SIGTERM at random points leave no
private copy and no traceback; a run that compares nothing is a failure with its own exit code; ``--list``
builds nothing; the script runs the installed toolkit or says what to install; bad input is one sentence.

The engine tests run on the SGLang 0.5.23 venv with a test folder written here (one small file importing the
module the token-ids patch edits), so each run is seconds of pytest, not the release's whole selection.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.support import sglang_tests
from toolkit.cli import main as toolkit_main
from toolkit.kit._releases import cache_dir

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "engine_own_tests.py"
SHIMS = REPO_ROOT / "tests" / "shims"
RELEASE = "sglang==0.5.23"
EXERCISES = "from sglang.srt.entrypoints.openai import serving_chat\n"


def upstream_folder(root: Path, body: str) -> Path:
    """A release's test folder as ``--tests`` wants it: ``test/...`` and a pytest.ini of its own."""
    folder = root / "upstream"
    (folder / "test" / "unit").mkdir(parents=True)
    (folder / "pytest.ini").write_text(sglang_tests.PYTEST_INI)
    (folder / "test" / "unit" / "test_chat.py").write_text(EXERCISES + body)
    return folder


def command(python: str, tests: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "toolkit", "own-tests", RELEASE, "--python", python, "--tests", str(tests),
            "--path", str(SHIMS), "--patch", "token-ids", *extra]


def copies_of(pid: int) -> list[Path]:
    return sorted((cache_dir() / "scratch").glob(f"own-tests-*-{pid}-*"))


# -- no engine ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, words", [
    (["own-tests", "sglang"], "DIST==VERSION"),
    (["own-tests", "torch==2.13.0"], "unknown engine distribution"),
    (["own-tests", RELEASE, "--record", "r.json", "--under", "test/x"], "--record keeps whole runs only"),
    (["own-tests", RELEASE, "--hf-home", "/nonexistent/hub"], "not a folder"),
    (["own-tests", RELEASE, "--timeout", "0"], "above 0"),
    (["own-tests", RELEASE, "--list", "--patch", "no-such-patch"], "unknown patch for sglang"),
    (["own-tests", RELEASE, "--tests", "."], "no test/ folder in it"),
    (["own-tests", RELEASE, "--list"], "pass --tests DIR"),  # the index has no SGLang sdist with its tests
    (["own-tests", RELEASE, "--release-from", "/nonexistent/record.json"], "no such file"),
    (["own-tests", RELEASE, "--record", "r.json", "--release-from", "r.json"], "not with --release-from"),
])
def test_bad_input_is_one_sentence_and_exit_2(argv, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert toolkit_main([*argv, "--json"]) == 2
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and words in report["error"] and "\n" not in report["error"]


def test_list_builds_and_copies_nothing(tmp_path):
    """``--list`` on a cache with no venv (issue 57: it built a 1.1 GB one): the chosen files, from the release's
    cached source tree; no venv, no scratch copy."""
    cache = tmp_path / "cache"
    cache.mkdir()
    for name in ("sources", "sources-slim"):
        (cache / name).symlink_to(cache_dir() / name)
    done = subprocess.run([sys.executable, str(SCRIPT), RELEASE, "--list"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "TOOLKIT_CACHE_DIR": str(cache)})
    assert done.returncode == 0, done.stderr
    assert "test/registered/openai_server/basic/test_serving_chat.py" in done.stdout
    assert sorted(p.name for p in cache.iterdir()) == ["engine-tests", "sources", "sources-slim"]
    assert [p.name for p in (cache / "engine-tests").iterdir()] == ["sglang-0.5.23"]  # the vendored tests' copy


def test_the_script_without_serving_toolkit_says_what_to_install(tmp_path):
    """An interpreter without this project: the checkout's ``toolkit/`` (no patches in it) is never run in its
    place; one sentence names what to install, exit 2 (issue 57: a RegistryError traceback, exit 1)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([sys.executable, "-S", str(SCRIPT), RELEASE, "--list"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=120, env=env)  # -S: no site-packages, so no installed toolkit
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "has no serving-toolkit installed" in done.stderr
    assert f"pip install -e {REPO_ROOT}" in done.stderr and "Traceback" not in done.stderr


# -- on the SGLang 0.5.23 venv --------------------------------------------------------------------------------

@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_that_compares_nothing_has_its_own_exit_code(sglang_python, tmp_path):
    """No test collected (the file imports the edited module and defines no test): exit 3 and why, never
    "passed 0, patched 0 ... OK" and 0 (issue 57); no file chosen at all: the same code."""
    collected_nothing = subprocess.run(command(sglang_python, upstream_folder(tmp_path / "a", ""), "--json"), cwd=tmp_path,
                                       capture_output=True, text=True, timeout=800)
    report = json.loads(collected_nothing.stdout)
    assert collected_nothing.returncode == 3, collected_nothing.stderr
    assert report["ok"] is False and report["kind"] == "nothing-compared"
    assert "pytest collected no test of the 1 files chosen" in report["error"]
    chosen_nothing = subprocess.run(command(sglang_python, upstream_folder(tmp_path / "b", ""), "--under", "test/elsewhere"),
                                    cwd=tmp_path, capture_output=True, text=True, timeout=800)
    assert chosen_nothing.returncode == 3
    assert "no test file of the release exercises the edited modules below test/elsewhere" in chosen_nothing.stderr
    assert "Traceback" not in chosen_nothing.stderr


# The patch rewrites serving_chat.py: a test reading its source passes on the release only.
STANDING_ON_A_RECORD = """
import inspect


def test_passes_on_both():
    assert serving_chat.OpenAIServingChat


def test_fails_on_both():
    assert serving_chat.OpenAIServingChat is None, "fails on the release too"


def test_broken_by_the_patch():
    assert "toolkit" not in inspect.getsource(serving_chat)
"""


BROKEN_BY_THE_PATCH = "test/unit/test_chat.py::test_broken_by_the_patch"
FAILS_ON_BOTH = "test/unit/test_chat.py::test_fails_on_both"


def record_of(path: Path, patches: list[str], not_passed: dict[str, str] | None) -> Path:
    """A record as ``--record`` writes it, of a whole run of STANDING_ON_A_RECORD: the release failed
    FAILS_ON_BOTH and passed the other two (what a run of both shows: the patch breaks only the third)."""
    from toolkit.kit import _own_tests_record as own_tests_record

    item = {"date": "2026-11-29", "patches": patches, "test_files": 1, "tests": 3, "release_passed": 2,
            "patched_passed": 1, "regressions": [BROKEN_BY_THE_PATCH], "fixed": [], "flaky": [], "not_run_servers": [],
            "seconds": 1.0, "failing_both": {"other": [{"test": FAILS_ON_BOTH, "reason": "AssertionError"}]}}
    if not_passed is not None:
        item["release_not_passed"] = not_passed
    path.write_text(json.dumps({"schema": 1, "releases": {RELEASE: item}}))
    assert own_tests_record.load(path)["releases"][RELEASE]["tests"] == 3
    return path


def test_a_record_that_cannot_stand_for_the_release_is_refused_before_any_copy(tmp_path, capsys, monkeypatch):
    """Another release, other patches, or a record made before it kept per-test outcomes: one sentence, exit 2,
    and no private copy was made (the record is read first)."""
    monkeypatch.chdir(tmp_path)
    cases = [(record_of(tmp_path / "other.json", ["tito"], {FAILS_ON_BOTH: "failed"}), "applied tito, this one token-ids"),
             (record_of(tmp_path / "older.json", ["token-ids"], None), "record it again with --record"),
             (tmp_path / "garbage.json", "cannot read it as a record")]
    (tmp_path / "garbage.json").write_text("{not json")
    for path, words in cases:
        argv = ["own-tests", RELEASE, "--patch", "token-ids", "--tests", str(upstream_folder(tmp_path / path.stem, "")),
                "--release-from", str(path), "--json"]
        assert toolkit_main(argv) == 2
        report = json.loads(capsys.readouterr().out)
        assert report["ok"] is False and words in report["error"] and "\n" not in report["error"], report
    other_release = record_of(tmp_path / "elsewhere.json", ["token-ids"], {})
    other_release.write_text(other_release.read_text().replace(RELEASE, "sglang==0.5.22"))
    assert toolkit_main(["own-tests", RELEASE, "--patch", "token-ids", "--release-from", str(other_release), "--json"]) == 2
    assert "no run of sglang==0.5.23 in it" in json.loads(capsys.readouterr().out)["error"]
    assert not copies_of(os.getpid())


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_run_standing_on_a_record_runs_only_what_differs_on_the_release(sglang_python, tmp_path):
    """``--release-from``: the release's outcomes from an earlier run's record (what CI does to halve the run):
    only the patched copy runs in full; the test the patch breaks differs from the record, so it runs on the
    release now and is a regression; the one failing on both is taken as the record has it."""
    record = record_of(tmp_path / "record.json", ["token-ids"], {FAILS_ON_BOTH: "failed"})
    tests = upstream_folder(tmp_path, STANDING_ON_A_RECORD)
    standing = subprocess.run(command(sglang_python, tests, "--json", "--release-from", str(record)), cwd=tmp_path,
                              capture_output=True, text=True, timeout=800)
    report = json.loads(standing.stdout)
    assert standing.returncode == 1, standing.stderr
    assert report["regressions"] == [BROKEN_BY_THE_PATCH] and "'toolkit' not in" in report["failures"][BROKEN_BY_THE_PATCH]
    assert (report["tests"], report["release_passed"], report["patched_passed"]) == (3, 2, 1)
    assert report["release_from"]["run_on_the_release_now"] == [BROKEN_BY_THE_PATCH]  # what differed, run for real
    assert [t["test"] for t in report["failing_both"]["other"]] == [FAILS_ON_BOTH]
    logs = Path(report["logs"])
    assert not (logs / "release.log").exists() and (logs / "rerun-release.log").is_file()


SIGNAL_RUNS = 3  # bounded: each run is stopped within its first seconds


@pytest.mark.engine
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_signal_at_a_random_point_removes_the_private_copies(sglang_python, tmp_path):
    """SIGINT or SIGTERM at a random point of a run (finding the engine, copying it, applying the patch, in
    pytest): exit 130, one word, no traceback, and no ``<cache>/scratch/own-tests-*`` of that run left (issue 57:
    up to 6,770 files left in 5 of 13 runs)."""
    tests = upstream_folder(tmp_path, "import time\n\ndef test_slow():\n    time.sleep(120)\n")
    seed = int(os.environ.get("OWN_TESTS_SIGNAL_SEED", time.time()))
    rng = random.Random(seed)
    for attempt in range(SIGNAL_RUNS):
        signum = (signal.SIGINT, signal.SIGTERM)[attempt % 2]
        delay = rng.uniform(2.0, 15.0)  # after the interpreter's start (a signal there is Python's)
        child = subprocess.Popen(command(sglang_python, tests), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        time.sleep(delay)
        child.send_signal(signum)
        stdout, stderr = child.communicate(timeout=300)
        where = f"seed {seed}, run {attempt}: {signal.Signals(signum).name} after {delay:.1f} s"
        assert child.returncode == 130, f"{where}: exit {child.returncode}\n{stderr[-3000:]}"
        assert stderr.strip().splitlines()[-1] == "interrupted" and "Traceback" not in stderr, f"{where}:\n{stderr}"
        assert copies_of(child.pid) == [], f"{where}: left {copies_of(child.pid)}"
