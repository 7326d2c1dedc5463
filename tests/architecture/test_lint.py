"""The linters' set-up (issue 52): scripts/test.sh runs scripts/lint.py (ruff, then mypy over the package as it
installs) before pytest, and the public faces stay under mypy's strict flags. The linters' findings themselves
are that script's to report; these tests keep its wiring from quietly coming apart."""

from __future__ import annotations

import tomllib

from tests.harness.fixtures import REPO_ROOT, load_script

PUBLIC_FACES = ["toolkit", "toolkit.api", "toolkit.declare", "toolkit.codemod", "toolkit.testing", "toolkit.releases",
                "toolkit.matrix", "toolkit.kit",
                # the kit's code behind its faces: strict where the faces are
                "toolkit.kit._declare", "toolkit.kit._codemod", "toolkit.kit._testing", "toolkit.kit._releases",
                "toolkit.kit._matrix"]
STRICT_FLAGS = ["disallow_any_generics", "disallow_subclassing_any", "disallow_untyped_calls", "disallow_untyped_defs",
                "disallow_incomplete_defs", "check_untyped_defs", "disallow_untyped_decorators", "warn_return_any",
                "strict_equality", "extra_checks"]


def _mypy_overrides() -> list[dict]:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["mypy"]["overrides"]


def test_every_public_face_is_type_checked_strictly_and_never_skipped():
    strict = [o for o in _mypy_overrides() if o.get("disallow_untyped_defs")]
    assert len(strict) == 1 and sorted(strict[0]["module"]) == sorted(PUBLIC_FACES)
    assert all(strict[0].get(flag) is True for flag in STRICT_FLAGS) and strict[0].get("implicit_reexport") is False
    skipped = [m for o in _mypy_overrides() if o.get("ignore_errors") for m in o["module"]]
    assert skipped == []  # every product module is checked (issue 52: patches/ too)


def test_mypy_sees_the_folders_where_they_install(tmp_path):
    lint = load_script("lint.py", "toolkit_lint_script")
    view = lint.installed_view(tmp_path)
    assert (view / "toolkit" / "api.py").resolve() == REPO_ROOT / "toolkit" / "api.py"
    for folder in ("patches", "verify", "kernels"):
        assert (view / "toolkit" / folder / "__init__.py").resolve() == REPO_ROOT / folder / "__init__.py"
    # findings name the repository's files, not the view's
    finding = "toolkit/patches/vllm/tito/runtime.py:3: error: x"
    assert lint.repo_path(finding, view) == "patches/vllm/tito/runtime.py:3: error: x"
    assert lint.repo_path("toolkit/api.py:3: error: x", view) == "toolkit/api.py:3: error: x"


def test_test_sh_lints_before_pytest_in_the_full_run_and_quick():
    script = (REPO_ROOT / "scripts" / "test.sh").read_text()
    # a phase of the builds before pytest (parallel_phases: any failing one stops the run there)
    lint_at = script.index('parallel_phases "lint (ruff, mypy)=$DEV_Q scripts/lint.py"')
    assert lint_at < script.index('"$DEV_PYTHON" -m pytest')
    # not inside the --quick branch (or any other if): both runs reach it
    before = script[:script.rindex("\n", 0, lint_at)].splitlines()
    assert sum(line.startswith("if ") for line in before) == sum(line == "fi" for line in before) > 0
