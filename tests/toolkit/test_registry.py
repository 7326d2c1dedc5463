"""The patch registry: every shipped patch is listed, and a patch's runtime module (imported inside
every engine process) loads neither libcst nor the patch engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from patches import all_patches

REPO = Path(__file__).resolve().parents[2]
RUNTIME_MODULES = sorted({m for p in all_patches() for m in p.runtime_modules})


def test_every_patch_package_is_registered():
    declared = {str(path.parent.relative_to(REPO)).replace("/", ".") for path in REPO.glob("patches/*/*/patch.py")}
    registered = {m for p in all_patches() for m in p.runtime_modules}
    assert declared and {m.rsplit(".", 1)[0] for m in registered} >= declared
    ids = [(p.engine, p.id) for p in all_patches()]
    assert len(ids) == len(set(ids))


@pytest.mark.parametrize("module", RUNTIME_MODULES)
def test_runtime_module_imports_nothing_of_the_patch_engine(module):
    code = (
        "import importlib, json, sys; importlib.import_module(%r); "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('libcst', 'toolkit'))))" % module
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
