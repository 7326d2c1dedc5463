"""docs/writing-patches.md, the porting guide, against the code and the examples:

* docs/kit-reference.md (every public name of kit API v1 with its signature; completeness is checked by
  tests/architecture/test_docs_map.py) is
  exactly what scripts/kit_reference.py generates from the docstrings, so it cannot drift;
* every example under examples/ builds and installs from nothing, offline, with only the commands the
  guide shows (its ``build-from-nothing`` block, run as written with EXAMPLE named), and the installed
  patch is then in `toolkit list`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.fixtures import REPO_ROOT

GUIDE = REPO_ROOT / "docs" / "writing-patches.md"
EXAMPLES = sorted(p.parent for p in (REPO_ROOT / "examples").glob("*/pyproject.toml"))


def test_the_kit_reference_is_what_the_docstrings_give():
    check = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "kit_reference.py"), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    reference = (REPO_ROOT / "docs" / "kit-reference.md").read_text()
    for helper in ("marked_statement(self, code: 'str')", "with_body(", "in_method(",
                   "assert_codemod(transformer:", "relpath: 'str' = 'module.py'", "assert_conforms("):
        assert helper in reference, helper
    assert "kit-reference.md" in GUIDE.read_text()


def guide_commands() -> list[str]:
    block = re.search(r"<!-- build-from-nothing -->\n```\n(.*?)```\n<!-- /build-from-nothing -->",
                      GUIDE.read_text(), re.S)
    assert block, "the guide lost its build-from-nothing block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_guide_builds_offline_without_isolation_or_dependencies():
    commands = "\n".join(guide_commands())
    assert "--no-build-isolation" in commands and "--no-deps" in commands and "--target" in commands
    # the backend the examples declare is put there first, and a too old one is refused in one line
    assert "pip install 'setuptools>=77'" in commands and "--check-build-dependencies" in commands
    for example in EXAMPLES:
        assert 'requires = ["setuptools>=77"]' in (example / "pyproject.toml").read_text(), example.name


@pytest.mark.slow
@pytest.mark.packaging
def test_the_guides_build_works_in_a_fresh_venv(tmp_path):
    """Issue 58: in a fresh venv the guide's build stopped at "invalid command 'bdist_wheel'" (Python 3.11's
    venv brings setuptools 65.5). The guide's lines up to the wheel, as written, in a fresh venv of this
    interpreter: the backend line may use the index (a fresh venv has nothing else), the build does not."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    checkout = tmp_path / "checkout"
    (checkout / "examples").mkdir(parents=True)
    example = EXAMPLES[0]
    subprocess.run(["cp", "-r", str(example), str(checkout / "examples")], check=True)
    copy, backend, build = [line.replace("EXAMPLE", example.name) for line in guide_commands()[:3]]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL", "PIP_NO_INDEX")}
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", PYTHONDONTWRITEBYTECODE="1")
    offline = {**env, "PIP_NO_INDEX": "1"}

    def sh(script: str, environment: dict[str, str]) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", f"set -e\n{script}"], cwd=checkout, env=environment, capture_output=True,
                              text=True, timeout=600)

    old = subprocess.run([str(venv / "bin" / "python"), "-c", "import setuptools; print(setuptools.__version__)"],
                         capture_output=True, text=True).stdout.strip()
    if old and int(old.split(".")[0]) < 77:  # the venv's own backend: refused in one line, not a traceback
        refused = sh(f"{copy}\n{build}", offline)
        assert refused.returncode != 0 and f"setuptools=={old} is incompatible with setuptools>=77" in refused.stderr
        subprocess.run(["rm", "-rf", str(checkout / "src")], check=True)
    assert sh(backend, env).returncode == 0
    built = sh(f"{copy}\n{build}", offline)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    assert len(list((checkout / "wheels").glob("*.whl"))) == 1


@pytest.mark.slow
@pytest.mark.packaging
@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_each_example_builds_and_installs_from_nothing_with_the_guides_commands(example, tmp_path):
    # run as written: `python` is this interpreter (the dev venv: setuptools, serving-toolkit), cwd is
    # a checkout (examples/ copied alone, so nothing else of the repository helps), no index
    checkout = tmp_path / "checkout"
    (checkout / "examples").mkdir(parents=True)
    subprocess.run(["cp", "-r", str(example), str(checkout / "examples")], check=True)
    script = "set -e\n" + "\n".join(guide_commands()).replace("EXAMPLE", example.name)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL")}
    env.update(PATH=f"{Path(sys.executable).parent}:{env['PATH']}", PIP_NO_INDEX="1", PYTHONDONTWRITEBYTECODE="1")
    run = subprocess.run(["bash", "-c", script], cwd=checkout, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    listed = run.stdout[re.search(r'^\{\s*"schema"', run.stdout, re.M).start():]  # pip's own lines come first
    ids = {p["id"] for p in json.loads(listed)["patches"]}
    (patch_id,) = [line.split("=")[0].strip() for line in (example / "pyproject.toml").read_text().splitlines()
                   if line.strip().endswith(':PATCH"')]
    assert patch_id in ids
    assert not list(example.glob("*.egg-info")) and not (example / "build").exists()  # built from the copy
