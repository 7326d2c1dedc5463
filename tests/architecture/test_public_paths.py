"""Every public name imports from the path it is documented at (issue 52: the tree moved under the faces,
and the faces stay where users and other patch packages find them).

The documented paths, read from the places that document them, so that a new mention is checked too:

- each ``from toolkit... import a, b`` and ``import toolkit...`` line of README.md, docs/*.md and the
  examples' patch packages;
- each backticked ``toolkit.x.y`` of README.md and the user docs (docs/architecture.md and
  docs/kit-reference.md map the internals: tests/architecture/test_docs_map.py checks those);
- the ``__all__`` of ``toolkit`` and of each module of kit API v1, and of the other faces;
- pyproject.toml's console script and the engine entry point this package's own code serves.
"""

from __future__ import annotations  # move52: faces (the paths here are the public ones, never rewritten)

import importlib
import re
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
USER_DOCS = [REPO / "README.md", *sorted(p for p in (REPO / "docs").glob("*.md")
                                         if p.name not in ("architecture.md", "kit-reference.md"))]
FACES = ("toolkit", "toolkit.api", "toolkit.errors", "toolkit.declare", "toolkit.codemod", "toolkit.testing",
         "toolkit.releases", "toolkit.matrix", "toolkit.ray", "toolkit.patch_study", "toolkit.start_check",
         "toolkit.patch_registry")
# the faces toolkit/ keeps at its top level, each a path users, patch packages or engines import
TOP_LEVEL = {"__init__.py", "__main__.py", *(f"{face.split('.')[1]}.py" for face in FACES[1:])}
IMPORT_LINE = re.compile(r"^\s*from (toolkit(?:\.\w+)*) import \(?([\w, ]+)\)?\s*(?:#.*)?$|^\s*import (toolkit(?:\.\w+)*)\s*$",
                         re.M)
DOTTED = re.compile(r"`(toolkit(?:\.\w+)+)(?:\(\))?`")


def documented_imports() -> set[tuple[str, str]]:
    """(module, name) for each documented import line; name "" for ``import module``."""
    texts = [p.read_text(encoding="utf-8") for p in USER_DOCS]
    texts += [p.read_text(encoding="utf-8") for p in sorted((REPO / "examples").rglob("*.py"))]
    found = set()
    for text in texts:
        for match in IMPORT_LINE.finditer(text):
            if match.group(3):
                found.add((match.group(3), ""))
                continue
            for name in match.group(2).split(","):
                if name.strip():
                    found.add((match.group(1), name.split(" as ")[0].strip()))
    return found


def documented_dotted() -> set[str]:
    return {m.group(1) for p in USER_DOCS for m in DOTTED.finditer(p.read_text(encoding="utf-8"))
            if m.group(1).rsplit(".", 1)[1] not in ("py", "md", "toml", "json")}  # a file's name, not a path


def resolve(dotted: str) -> object:
    """The object ``dotted`` names: its longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        try:
            value: object = importlib.import_module(".".join(parts[:n]))
        except ModuleNotFoundError:
            continue
        for attribute in parts[n:]:
            value = getattr(value, attribute)
        return value
    raise ModuleNotFoundError(dotted)


def test_the_docs_are_read():
    imports = documented_imports()
    assert ("toolkit", "apply_patch") in imports and ("toolkit.api", "repair_engines") in imports
    assert ("toolkit.testing", "assert_codemod") in imports and "toolkit.ray.apply_patch_on_cluster" in documented_dotted()


@pytest.mark.parametrize("module, name", sorted(documented_imports()))
def test_each_documented_import_works(module, name):
    imported = importlib.import_module(module)
    if name and not hasattr(imported, name):
        importlib.import_module(f"{module}.{name}")  # `from toolkit import releases`: a module of the package


@pytest.mark.parametrize("dotted", sorted(documented_dotted()))
def test_each_documented_dotted_name_exists(dotted):
    resolve(dotted)


@pytest.mark.parametrize("face", FACES)
def test_each_face_exports_what_its_all_names(face):
    module = importlib.import_module(face)
    missing = [name for name in getattr(module, "__all__", ()) if not hasattr(module, name)]
    assert missing == []


def test_the_faces_keep_what_their_users_import():
    from toolkit import PatchError, __version__, apply_patch, patch_status, revert_patch  # noqa: F401
    from toolkit.errors import PatchError as Base
    from toolkit.errors import RegistryError, UsageError
    from toolkit.patch_registry import Catalog, catalog, ordered, registry, select  # noqa: F401  scripts/
    from toolkit.patch_study import PatchStudy  # noqa: F401
    from toolkit.ray import ClusterPatchError, apply_patch_on_cluster  # noqa: F401
    from toolkit.start_check import vllm_plugin  # noqa: F401  the vllm.general_plugins entry point

    assert issubclass(UsageError, Base) and issubclass(RegistryError, Base) and PatchError is Base


def test_pyproject_entry_points_of_this_package_resolve():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    targets = list(project["scripts"].values())
    targets += [v for group in project["entry-points"].values() for v in group.values()
                if not v.startswith("toolkit.patches.")]  # the patches' own: tests/toolkit/test_registry.py
    assert "toolkit.__main__:run" in targets and "toolkit.start_check:vllm_plugin" in targets
    for target in targets:
        module, _, attribute = target.partition(":")
        assert callable(getattr(importlib.import_module(module), attribute)), target


def test_toolkit_keeps_at_most_a_dozen_modules_at_its_top_level_all_of_them_faces():
    top = {p.name for p in (REPO / "toolkit").glob("*.py")}
    assert top == TOP_LEVEL
    assert len(top - {"__init__.py"}) <= 12


KIT_FACES = ("toolkit.declare", "toolkit.codemod", "toolkit.testing", "toolkit.releases", "toolkit.matrix")


def test_the_kit_is_one_package_with_one_all():
    """``toolkit.kit`` holds kit API v1 behind one ``__all__``: the five public paths' names, each the same
    object there as at its public path (issue 59: the kit had lived in two places)."""
    import toolkit.kit

    names = [name for face in KIT_FACES for name in importlib.import_module(face).__all__]
    assert sorted(set(names)) == sorted(toolkit.kit.__all__) and len(toolkit.kit.__all__) == len(set(toolkit.kit.__all__))
    for face in KIT_FACES:
        module = importlib.import_module(face)
        assert [n for n in module.__all__ if getattr(module, n) is not getattr(toolkit.kit, n)] == [], face


@pytest.mark.parametrize("face", [f for f in FACES if f not in ("toolkit", "toolkit.api", "toolkit.errors",
                                                                  "toolkit.patch_registry")])
def test_a_face_holds_no_code(face):
    """A face is a path, not a second home: a docstring, imports of its names from where they live, an
    ``__all__``; its code lives in one module of a package (the kit's, the cluster's, the clients')."""
    import ast

    path = Path(importlib.import_module(face).__file__)
    body = ast.parse(path.read_text()).body
    kinds = [type(node).__name__ for node in body]
    assert kinds[0] == "Expr" and set(kinds[1:-1]) <= {"ImportFrom"} and kinds[-1] == "Assign", (face, kinds)
    assert [t.id for t in body[-1].targets] == ["__all__"]


def test_reading_a_declaration_loads_only_the_declarations():
    """``toolkit.declare`` runs in every engine process (the vLLM plugin reads a release range) and in
    ``toolkit list``: through the kit's package it loads the declarations' module and nothing of the kit's else."""
    import subprocess
    import sys

    code = ("import sys, toolkit.declare; "
            "print(sorted(m for m in sys.modules if m.startswith('toolkit.kit') or m == 'libcst'))")
    out = subprocess.run([sys.executable, "-c", code], cwd="/", capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['toolkit.kit', 'toolkit.kit._declare']", out.stdout
