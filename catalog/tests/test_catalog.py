"""The catalog as a distribution: pyproject.toml registers exactly the fix folders, each under the
engine its ``PATCH`` names, each a pure code fix (the patched engine imports nothing of the catalog)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import toolkit_catalog

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


def test_the_entry_points_are_exactly_the_fix_folders():
    points = tomllib.loads(PYPROJECT.read_text())["project"]["entry-points"]["toolkit.patches"]
    assert sorted(points.values()) == sorted(f"{m}.patch:PATCH" for m in toolkit_catalog.fix_modules())
    assert {p.id for p in toolkit_catalog.patches()} == set(points)  # the entry name is the patch id


def test_each_fix_sits_under_its_engine_and_has_no_runtime():
    for module, patch in zip(toolkit_catalog.fix_modules(), toolkit_catalog.patches(), strict=True):
        assert module.split(".")[1] == patch.engine, module
        assert not patch.runtime_modules, f"{patch.id}: a catalog fix is plain engine code"
        assert all(ref.startswith(f"{module}.codemods:") for edit in patch.files for ref in edit.transformers)
