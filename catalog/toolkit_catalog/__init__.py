"""serving-toolkit-catalog: the engine fixes RL frameworks keep (monkeypatched methods, string
replacements, ``exec``'d sources, patch files), each ported to a serving-toolkit patch.

One subpackage per fix, ``toolkit_catalog/<engine>/<fix>/``: ``patch.py`` declares ``PATCH``,
``codemods.py`` holds its transformers (every fix here is pure code: the patched engine imports
nothing from this package). Each ``PATCH`` is registered in the ``toolkit.patches`` entry-point group
(pyproject.toml), so ``toolkit list`` shows it and ``toolkit apply-patch --patch ID`` applies it.
Where each fix comes from, and the fixes not ported, with why: README.md (generated from
findings.toml by scripts/catalog_table.py).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolkit.declare import Patch

HERE = Path(__file__).resolve().parent
ENGINES = ("vllm", "sglang")


def fix_modules() -> list[str]:
    """``toolkit_catalog.<engine>.<fix>`` of every fix folder (one with a patch.py), sorted."""
    return sorted(f"{__name__}.{engine}.{patch.parent.name}"
                  for engine in ENGINES for patch in (HERE / engine).glob("*/patch.py"))


def patches() -> list[Patch]:
    """Every fix's ``PATCH`` (imports only the declarations: no libcst)."""
    return [importlib.import_module(f"{module}.patch").PATCH for module in fix_modules()]
