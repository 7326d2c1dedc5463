"""Nothing in scripts/ imports the tests: the tests may use the scripts (and scripts/support/, what the
two share), never the other way round, so a script runs from a checkout without its tests' helpers.
Every import counts, a function's own included, and so does ``importlib.import_module("tests...")``."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.harness.fixtures import REPO_ROOT


def _is_tests(module: str | None) -> bool:
    return module is not None and (module == "tests" or module.startswith("tests."))


def imports_of_tests(source: str) -> list[tuple[int, str]]:
    """(line, module) of every import of ``tests`` or a module under it in ``source``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if _is_tests(alias.name)]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and _is_tests(node.module):
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in ("import_module", "__import__") and _is_tests(node.args[0].value):
                found.append((node.lineno, node.args[0].value))
    return found


def script_files() -> list[Path]:
    return sorted((REPO_ROOT / "scripts").rglob("*.py"))


def test_no_script_imports_the_tests():
    found = [f"{path.relative_to(REPO_ROOT)}:{line}: imports {module}"
             for path in script_files() for line, module in imports_of_tests(path.read_text())]
    assert found == [], "scripts must not import tests (move what they share to scripts/support/):\n" + "\n".join(found)


def test_the_scripts_and_their_support_folder_are_all_read():
    names = {str(path.relative_to(REPO_ROOT / "scripts")) for path in script_files()}
    assert {"envs.py", "bench_patch_sweep.py", "support/vllm_private.py"} <= names


def test_every_form_of_import_of_the_tests_is_found():
    source = '''
import tests
import os, tests.harness.fixtures as fixtures
from tests.patches import support
from tests import harness

def later():
    from tests.harness.fixtures import ensure_source_tree
    importlib.import_module("tests.patches.vllm")
    __import__("tests")
'''
    assert [line for line, _ in imports_of_tests(source)] == [2, 3, 4, 5, 8, 9, 10]


def test_imports_that_only_look_alike_are_not_counted():
    source = '''
import testsuite
from tests_helpers import x
from .tests import y
from scripts.support import venvs
importlib.import_module("testing")
'''
    assert imports_of_tests(source) == []
