"""``toolkit matrix``: every release of each engine line x every registered patch of its engine.

Per release and patch (any registered patch, another distribution's too): declared (the patch's range
contains the release), anchors found/total (what ``toolkit check --source`` reports), golden (on a copy
of the patch's files, through the patch engine: apply, compile, marker, second apply a no-op, revert
byte-identical; tried on undeclared releases too, not at all when an anchor is missing: ``n/a``) and
group: releases whose files edited by the patch have the same sha256 share a group, so one behaviour
test per group covers them all (and the anchors and golden run once per group). The releases' files
come from :mod:`toolkit.releases`.
"""

from __future__ import annotations

import hashlib
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from toolkit import patch_registry
from toolkit.kit import _releases as releases
from toolkit.kit._declare import Patch
from toolkit.errors import UsageError
from toolkit.patch_registry import Catalog
from toolkit.engine.sources import SourceTree
from toolkit.kit._testing import anchor_problems, golden_problems

# Kit API v1: what `toolkit matrix` is made of, for a script that builds its own table
# (scripts/compat_matrix.py); docs/kit-reference.md.
__all__ = ["Cell", "choose_releases", "evaluate", "run", "problems"]


@dataclass
class Cell:
    """One release x one patch."""

    dist: str
    version: str
    engine: str
    patch: str
    declared: bool
    anchors_found: int
    anchors_total: int
    missing: list[str] = field(default_factory=list)  # "file: anchor (problem)" or "file: error"
    golden: str = ""  # "ok", "n/a" (an anchor is missing: the apply refuses), or the problems
    digest: str = ""  # sha256 over the files this patch edits, as this release ships them
    group: str = ""  # g1, g2, ... per patch, in release order
    not_needed: str = ""  # why the release needs no patch (``Patch.not_needed``), or ""

    @property
    def anchors_ok(self) -> bool:
        return not self.missing and self.anchors_total > 0

    @property
    def ok(self) -> bool:
        """Proved as far as the sources go: every anchor found and the golden apply clean."""
        return self.anchors_ok and self.golden == "ok"


def files_digest(tree: SourceTree, patch: Patch) -> str:
    """sha256 over (relpath, sha256 of its bytes) of every file ``patch`` edits on this release
    (:meth:`Patch.files_for`); a file the release lacks counts as ``missing``."""
    outer = hashlib.sha256()
    for edit in patch.files_for(tree.version):
        data = tree.read(edit.relpath)
        inner = hashlib.sha256(data).hexdigest() if data is not None else "missing"
        outer.update(f"{edit.relpath}\0{inner}\n".encode())
    return outer.hexdigest()


def evaluate(tree: SourceTree, patches: Sequence[Patch] | None = None, *, catalog: Catalog | None = None) -> list[Cell]:
    """Every registered patch of ``tree``'s engine (or ``patches``) on this one release."""
    catalog = catalog or patch_registry.catalog(tree.engine)
    cells = []
    for patch in patches if patches is not None else catalog.patches:
        found, total, missing = anchor_problems(tree, patch)
        cell = Cell(tree.distribution, tree.version, tree.engine, patch.id, patch.supports(tree.version),
                    found, total, missing, digest=files_digest(tree, patch), not_needed=patch.not_needed_on(tree.version))
        if cell.anchors_ok:
            with tempfile.TemporaryDirectory(prefix="toolkit-matrix-") as tmp:
                problems = golden_problems(tree, patch, Path(tmp), allow_unknown_version=True, catalog=catalog)
            cell.golden = "ok" if not problems else "; ".join(problems)
        else:
            cell.golden = "n/a"
        cells.append(cell)
    return cells


def assign_groups(cells: Sequence[Cell]) -> None:
    """g1, g2, ... per (engine, patch): releases sharing the sha256 of the patch's files share a group,
    numbered in the order the rows come (oldest release first)."""
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for cell in cells:
        groups = seen.setdefault((cell.engine, cell.patch), {})
        cell.group = groups.setdefault(cell.digest, f"g{len(groups) + 1}")


def release_order(release: tuple[str, str]) -> tuple[int, Any]:
    from packaging.version import Version

    return list(releases.LINES).index(release[0]), Version(release[1])


def choose_releases(engines: Sequence[str], *, index: bool = False, offline: bool = False) -> list[tuple[str, str]]:
    """Every release of the engines' lines: those cached (``offline``), on the index (``index``), or
    KNOWN_RELEASES."""
    if index and offline:
        raise UsageError("--index asks the package index, --offline forbids it: choose one")
    lines = [dist for dist, (engine, _) in releases.LINES.items() if engine in engines]
    if offline:
        return [(d, v) for d in lines for v in releases.cached_releases(d)]
    if index:
        return [(d, v) for d in lines for v in releases.index_releases(d)]
    return [(d, v) for d in lines for v in releases.KNOWN_RELEASES[d]]


# The pool's work, set before the fork so that each child inherits it: a job is an index into it (a patch need
# not pickle: another distribution's or a test's patch may be a class in no importable module).
_WORK: list[tuple[SourceTree, Patch, Catalog]] = []


def _evaluate_one(index: int) -> Cell:
    tree, patch, catalog = _WORK[index]
    return evaluate(tree, [patch], catalog=catalog)[0]


def _evaluate_work(work: list[tuple[SourceTree, Patch, Catalog]], jobs: int) -> list[Cell]:
    """Each (release tree, patch, catalog)'s cell, ``jobs`` processes at a time where the platform forks."""
    import multiprocessing

    global _WORK
    _WORK = work
    try:
        if jobs > 1 and len(work) > 1 and "fork" in multiprocessing.get_all_start_methods():
            with multiprocessing.get_context("fork").Pool(min(jobs, len(work))) as pool:
                return pool.map(_evaluate_one, range(len(work)), chunksize=1)
        return [_evaluate_one(index) for index in range(len(work))]
    finally:
        _WORK = []


def run(patches: Sequence[Patch], chosen: Sequence[tuple[str, str]], *, offline: bool = False,
        keep_wheels: bool = False, known: Sequence[Patch] | None = None,
        progress: Callable[[str], None] | None = None, jobs: int = 1) -> list[Cell]:
    """``patches`` on every release of ``chosen`` of their engines, oldest first per line, grouped.
    ``known``: the registry as the command read it (default: read now).

    Anchors and golden are a function of the patch's transformers and the bytes of the files it edits
    (codemods follow the code's structure, never the version number): they are checked once per sha256
    group, on the group's first release, ``jobs`` patches at a time (forked processes, where the platform
    has fork); the other releases of the group take that cell with their own ``declared`` and ``not_needed``."""
    if jobs < 1:
        raise UsageError(f"jobs must be a whole number of processes >= 1, not {jobs}")
    known = list(patch_registry.registry() if known is None else known)
    work: list[tuple[SourceTree, Patch, Catalog]] = []  # one per (engine, patch, digest): its first release
    first: dict[tuple[str, str, str], int] = {}  # (engine, patch id, digest) -> its index in work
    rows: list[tuple[SourceTree, Patch, int]] = []  # the cells in table order: release, patch, its work
    for dist, version in sorted(set(chosen), key=release_order):
        engine = releases.LINES[dist][0]
        mine = [p for p in patches if p.engine == engine]
        if not mine:
            continue
        catalog = patch_registry.catalog(engine, known)
        # only the selected patches' files are read: a slim tree holding them is reused as it is (one a test
        # cut with `releases.release_tree`); a cut made anyway takes every registered patch's files, so one
        # download serves each later run
        wanted = sorted({relpath for patch in mine for relpath in patch.relpaths})
        tree = releases.release_tree(dist, version, wanted, offline=offline, keep_wheel=keep_wheels,
                                     widen_to=sorted(catalog.relpaths()))
        if progress:
            progress(f"{dist} {version}: read for {len(mine)} patch(es)")
        for patch in mine:
            index = first.setdefault((engine, patch.id, files_digest(tree, patch)), len(work))
            if index == len(work):
                work.append((tree, patch, catalog))
            rows.append((tree, patch, index))
    if progress:
        progress(f"checking {len(work)} distinct file set(s) for {len(rows)} cell(s)")
    checked = _evaluate_work(work, jobs)
    cells = []
    for tree, patch, index in rows:
        cell = checked[index]
        if (cell.dist, cell.version) != (tree.distribution, tree.version):  # what the version decides is its own
            cell = replace(cell, dist=tree.distribution, version=tree.version, declared=patch.supports(tree.version),
                           not_needed=patch.not_needed_on(tree.version), missing=list(cell.missing))
        cells.append(cell)
    assign_groups(cells)
    return cells


def problems(cells: Sequence[Cell]) -> list[str]:
    """A sentence per declared release x patch whose anchors or golden fail; one when nothing was checked
    (an empty table proves nothing, so it is never a success)."""
    if not cells:
        return ["nothing was checked: no release of the selected patches' engines was found (--offline reads "
                "only the releases already in the cache, $TOOLKIT_CACHE_DIR)"]
    out = []
    for c in cells:
        if c.declared and not c.ok:
            why = "anchors missing: " + "; ".join(c.missing) if not c.anchors_ok else f"golden fails: {c.golden}"
            out.append(f"{c.dist} {c.version} {c.patch}: declared, but {why}")
    return out


def print_table(console: Any, cells: Sequence[Cell], verbose: bool = False) -> None:
    """The cells as a rich table: a row per release x patch."""
    from rich.table import Table
    from rich.text import Text

    table = Table(title="toolkit matrix")
    for column in ("release", "patch", "declared", "anchors", "golden", "group"):
        table.add_column(column, no_wrap=column != "anchors" and column != "golden", min_width=5, overflow="fold")
    for c in cells:
        anchors = f"{c.anchors_found}/{c.anchors_total}"
        if c.missing:
            anchors += (": misses " + "; ".join(c.missing)) if verbose else f" ({len(c.missing)} missing)"
        golden = c.golden if c.golden in ("ok", "n/a") else f"FAILS: {c.golden}"
        style = "green" if c.ok else ("red" if c.declared else "dim")
        declared = "yes" if c.declared else "not needed" if c.not_needed else "no"
        table.add_row(Text(f"{c.dist} {c.version}"), Text(c.patch), declared, Text(anchors),
                      Text(golden, style=style), f"{c.group} {c.digest[:8]}" if verbose else c.group)
    console.print(table)
