"""``toolkit own-tests`` from an installed wheel, outside the repository, on an outside patch (issue 58).

The wheel of this checkout (tests/packaging/test_wheel.py's fixture) goes non-editable into a fresh venv that
sees the SGLang 0.5.23 engine venv's packages (a ``.pth`` line naming its site-packages: the engine and its
dependencies, none of this checkout); ``toolkit new-patch`` writes an outside patch there, pip installs it, and
``toolkit own-tests sglang==0.5.23 --patch <it>`` runs from a folder outside the repository on one upstream
test file (the vendored tests of scripts/support/sglang_tests.py). The repository's script, run by that venv
from the checkout, uses the installed toolkit, never the checkout's ``toolkit/`` (issue 57).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from scripts.support import sglang_tests
from tests.packaging.test_wheel import checked, new_venv, run, site_packages, wheel  # noqa: F401  (wheel: a fixture)
from toolkit.kit._releases import cache_dir

REPO = Path(__file__).resolve().parents[2]
PATCH_ID = "hello-own"
# it imports serving_chat, which the patch edits, and 11 of its tests pass on the release (most of
# test_serving_chat.py fail there: the vendored files predate 0.5.23)
ONE_FILE = "test/registered/openai_server/basic/test_return_token_ids.py"

pytestmark = [pytest.mark.engine, pytest.mark.slow, pytest.mark.packaging]


@pytest.mark.timeout(1500)
def test_own_tests_runs_from_the_wheel_on_an_outside_patch(wheel, sglang_python, tmp_path):  # noqa: F811
    python = new_venv(tmp_path / "venv")
    site = site_packages(python)
    (site / "engine.pth").write_text(f"{site_packages(Path(sglang_python))}\n")
    checked([python, "-m", "pip", "install", "-q", "--no-deps", wheel])
    where = checked([python, "-c", "import toolkit; print(toolkit.__file__)"]).stdout.strip()
    assert where.startswith(str(site)), where  # the wheel's, not this checkout's

    toolkit = tmp_path / "venv" / "bin" / "toolkit"
    checked([toolkit, "new-patch", PATCH_ID, "--engine", "sglang", "--dir", tmp_path / "skeleton"], cwd=tmp_path)
    # (build isolation: setuptools and wheel from the index, as a user's pip does)
    checked([python, "-m", "pip", "install", "-q", "--no-deps", tmp_path / "skeleton"])
    listed = json.loads(checked([toolkit, "list", "sglang", "--json"], cwd=tmp_path).stdout)
    assert PATCH_ID in {p["id"] for p in listed["patches"]}

    tests = sglang_tests.fetch("0.5.23", cache_dir())
    done = run([toolkit, "own-tests", "sglang==0.5.23", "--patch", PATCH_ID, "--tests", tests, "--under", ONE_FILE,
                "--path", REPO / "tests" / "shims", "--json"], cwd=tmp_path)
    report = json.loads(done.stdout) if done.stdout.strip() else {}
    assert done.returncode == 0 and report.get("ok"), f"exit {done.returncode}: {report}\n{done.stderr[-3000:]}"
    assert report["patches"] == [PATCH_ID] and report["edited_files"] == ["srt/entrypoints/openai/serving_chat.py"]
    assert list(report["test_files"]) == [ONE_FILE]
    assert report["release_passed"] > 0 and report["patched_passed"] >= report["release_passed"]

    # the repository's script, run from the checkout by this venv: the installed toolkit, not ./toolkit/
    listing = checked([python, REPO / "scripts" / "engine_own_tests.py", "sglang==0.5.23", "--list"], cwd=REPO)
    assert ONE_FILE in listing.stdout
