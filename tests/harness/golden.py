"""The golden check of one patch on one engine source tree, on a copy of just the files it edits.

Shared by the conformance suite (tests/conformance/test_every_patch.py) and the compatibility matrix
(scripts/compat_matrix.py): through the patch engine as ``toolkit apply-patch`` runs it, the apply
edits every declared file, each result compiles and carries the patch's marker, ``status`` says
``applied``, a second apply has nothing to do, and the revert puts every file back byte for byte
with no manifest or backup left behind. Imports no pytest: the script runs it outside a test.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from toolkit import engine
from toolkit.declare import Patch
from toolkit.discovery import InstalledEngine
from toolkit.errors import PatchError
from toolkit.sources import SourceTree


def copy_files(tree: SourceTree, relpaths: list[str], root: Path) -> InstalledEngine:
    """A site under ``root`` with just these files of ``tree``'s package: the engine reads nothing else."""
    package_dir = root / "site" / tree.package
    for relpath in relpaths:
        data = tree.read(relpath)
        if data is None:
            raise FileNotFoundError(f"{tree.distribution} {tree.version} has no {relpath}")
        target = package_dir / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return InstalledEngine(tree.engine, tree.distribution, tree.version, str(package_dir), sys.executable)


def digests(installed: InstalledEngine, relpaths: list[str]) -> dict[str, str]:
    return {r: hashlib.sha256((Path(installed.package_dir) / r).read_bytes()).hexdigest() for r in relpaths}


def golden_problems(tree: SourceTree, patch: Patch, root: Path, *, allow_unknown_version: bool = False) -> list[str]:
    """What goes wrong applying ``patch`` to a copy of its files of ``tree`` under ``root``, and
    reverting it; ``[]`` when nothing does. A refusal of the patch engine is one problem, not a raise."""
    relpaths = [edit.relpath for edit in patch.files]
    installed = copy_files(tree, relpaths, root)
    before = digests(installed, relpaths)
    problems: list[str] = []
    try:
        result = engine.apply(installed, [patch.id], allow_unknown_version=allow_unknown_version)
    except PatchError as exc:
        return [f"apply refused: {exc}"]
    if sorted(result.changed_files) != sorted(relpaths):
        problems.append(f"apply changed {sorted(result.changed_files)}, declared {sorted(relpaths)}")
    for relpath in relpaths:
        text = (Path(installed.package_dir) / relpath).read_text()
        try:
            compile(text, relpath, "exec")
        except SyntaxError as exc:
            problems.append(f"{relpath}: patched result does not compile: {exc}")
        if f"# toolkit:{patch.id}" not in text:
            problems.append(f"{relpath}: no `# toolkit:{patch.id}` marker")
    states = [s.state for s in engine.status(installed) if s.patch_id == patch.id]
    if states != [engine.APPLIED]:
        problems.append(f"status after apply is {states}, not applied")
    if engine.apply(installed, [patch.id], allow_unknown_version=allow_unknown_version).changed_files:
        problems.append("a second apply changed files (must have nothing to do)")
    engine.revert(installed, [patch.id])
    changed = sorted(r for r, digest in digests(installed, relpaths).items() if digest != before[r])
    if changed:
        problems.append(f"revert is not byte-identical: {changed}")
    left = sorted(p.name for p in (installed.site_dir / ".toolkit-state" / tree.engine).iterdir())
    if left != ["lock"]:
        problems.append(f"revert left {left} in the state directory (want only the lock)")
    if {s.state for s in engine.status(installed) if s.patch_id == patch.id} != {engine.NOT_APPLIED}:
        problems.append("status after revert is not `not applied`")
    return problems
