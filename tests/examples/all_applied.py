"""Run by tests/examples/test_every_example.py in a subprocess whose PYTHONPATH holds the installed
examples and catalog: for the patches named (one example's, or all the catalog's fixes of one engine),
on every release one of them declares (the cached slim trees, offline), apply those that support the
release together with every first-party patch that supports it, on a copy of all their files, as a
plain `toolkit apply-patch` would with the package installed; check each one's marker and `applied`
status; revert all; the files must be the release's bytes.

Prints one JSON object: {"dist==version": {"applied": [ids], "problems": [...]}} (no problem where
all is well).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from toolkit import patch_registry, releases
from toolkit.engine import patching as engine
from toolkit.engine import status as patch_states
from toolkit.errors import PatchError
from toolkit.testing import copy_files, digests


def first_party(patch) -> bool:
    """One of serving-toolkit's own patches: its codemods live in the ``toolkit`` package."""
    refs = [ref for edit in patch.files for ref in edit.transformers]
    return all(isinstance(ref, str) and ref.startswith("toolkit.") for ref in refs)


def problems_on(patch_ids: list[str], engine_name: str, dist: str, version: str) -> tuple[list[str], list[str]]:
    """(the ids applied together, what went wrong)."""
    catalog = patch_registry.catalog(engine_name)
    together = [p for p in catalog.patches if p.supports(version) and (p.id in patch_ids or first_party(p))]
    relpaths = sorted({edit.relpath for p in together for edit in p.files_for(version)})
    tree = releases.release_tree(dist, version, sorted(catalog.relpaths()), offline=True)
    with tempfile.TemporaryDirectory(prefix="toolkit-all-applied-") as tmp:
        installed = copy_files(tree, relpaths, Path(tmp))
        pristine = digests(installed, relpaths)
        ids = [p.id for p in together]
        try:
            engine.apply(installed, together, allow_unknown_version=True, catalog=catalog)
        except PatchError as exc:
            return ids, [f"apply of {', '.join(ids)} refused: {exc}"]
        problems = []
        states = {s.patch_id: s.state for s in engine.status(installed, catalog=catalog)}
        problems += [f"{i} is {states.get(i)} with all applied" for i in ids if states.get(i) != patch_states.APPLIED]
        for p in together:
            for edit in p.files_for(version):
                text = (Path(installed.package_dir) / edit.relpath).read_text()
                if f"# toolkit:{p.id}" not in text:
                    problems.append(f"{edit.relpath}: no marker of {p.id} with all applied")
                try:
                    compile(text, edit.relpath, "exec")
                except SyntaxError as exc:
                    problems.append(f"{edit.relpath} does not compile with all applied: {exc}")
        engine.revert(installed, catalog=catalog)
        changed = sorted(r for r, d in digests(installed, relpaths).items() if d != pristine[r])
        if changed:
            problems.append(f"revert of all is not byte-identical: {changed}")
        return ids, problems


def main(args: list[str]) -> int:
    """``PATCH_ID ... [--only DIST==VERSION ...]``: ``--only`` keeps those of the releases (scripts/test.sh --quick)."""
    patch_ids = args[:args.index("--only")] if "--only" in args else args
    only = set(args[args.index("--only") + 1:]) if "--only" in args else None
    named = [p for p in patch_registry.registry() if p.id in patch_ids]
    (engine_name,) = {p.engine for p in named}  # one engine's patches at a time
    known = releases.releases_of(engine_name, ">=0")
    wanted = sorted({release for p in named for release in releases.releases_of(engine_name, p.versions)
                     if only is None or f"{release[0]}=={release[1]}" in only}, key=known.index)
    report = {}
    for dist, version in wanted:
        applied, problems = problems_on(patch_ids, engine_name, dist, version)
        report[f"{dist}=={version}"] = {"applied": applied, "problems": problems}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
