"""The patch engine: apply, revert, status and check, for any patch of any supported engine.

Every change goes through one reconciliation: given the patches that should be applied to an engine
install, derive each edited file's wanted bytes from its pristine original (the backup), then write
only what differs. Applying more patches and reverting some or all of them are the same operation
with a different target set, so the order of earlier applies never matters.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from toolkit import patch_registry
from toolkit.engine import fs
from toolkit.kit._declare import Patch, not_a_release
from toolkit.engine.discovery import InstalledEngine
from toolkit.errors import PatchError, UsageError, io_error
from toolkit.engine.journal import FileChange, clear_orphans, write_all_or_nothing
from toolkit.patch_registry import Catalog
from toolkit.engine.versions import applicable
from toolkit.engine.plan import (Plan, check_install, edited_files, engine_file, link_refused, make_plan,
                                 refuse_links, stale_manifest)
from toolkit.engine.state import Manifest, StateDir
from toolkit.engine.status import PatchState
from toolkit.engine.status import status as _status
from toolkit.base.version import __version__

DEFAULT_LOCK_TIMEOUT = 60.0


@dataclass
class Result:
    """What an apply or revert did (or, with dry_run, would do)."""

    engine: InstalledEngine
    patches: list[str]  # the patches applied to the engine afterwards
    changed: list[FileChange] = field(default_factory=list)
    dry_run: bool = False
    # the engine's patches an apply of "every patch" left out, and why ({"patch", "reason", "detail"})
    skipped: list[dict[str, str]] = field(default_factory=list)
    applied_before: list[str] = field(default_factory=list)  # the patches applied when the run began

    @property
    def newly_applied(self) -> list[str]:
        """The patches this run applied (with dry_run: would apply), not those it found applied."""
        return [p for p in self.patches if p not in self.applied_before]

    @property
    def changed_files(self) -> list[str]:
        return [change.relpath for change in self.changed]

    def diff(self) -> str:
        return "".join(change.diff() for change in self.changed)


def reconcile(
    engine: InstalledEngine,
    catalog: Catalog,
    *,
    add: Sequence[Patch] = (),
    remove: Sequence[Patch] | None = (),
    force: bool = False,
    dry_run: bool = False,
    allow_editable: bool = False,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> Result:
    """Apply ``add`` and revert ``remove`` (None: every applied patch) on ``engine``, whose registered
    patches are ``catalog``; the applied set is read under the lock, so concurrent runs compose. Nothing
    is written unless every file transforms, and a failed write puts back every file it had replaced."""
    if add:  # a revert only ever puts the user's own bytes back
        check_install(engine, allow_editable)
    state = StateDir(engine.site_dir, engine.engine)
    try:
        refuse_links(engine, edited_files(engine, catalog))  # before the lock: a refusal writes nothing at all
        # every write from here on walks down from site-packages following no link: one planted while the
        # codemods run is refused at the write, which puts back what it had written
        with fs.confined(engine.site_dir):
            if dry_run:  # a dry run writes nothing at all, not even the lock file
                return _reconcile_locked(engine, catalog, state, add, remove, force, True)
            with state.lock(lock_timeout):
                return _reconcile_locked(engine, catalog, state, add, remove, force, False)
    except fs.LinkInTheWay as exc:  # met under the lock before any write (a file's mode read without following)
        raise link_refused(engine, exc.filename) from None
    except OSError as exc:
        raise io_error(exc, "cannot read") from None


def _reconcile_locked(
    engine: InstalledEngine, catalog: Catalog, state: StateDir, add: Sequence[Patch], remove: Sequence[Patch] | None,
    force: bool, dry_run: bool,
) -> Result:
    old_raw = state.read_manifest_bytes()
    manifest = state.parse_manifest(old_raw) if old_raw is not None else None
    # decided once, from the files as they are before this run writes (stale_manifest hashes them)
    stale = manifest is not None and stale_manifest(engine, manifest)
    if not dry_run and not stale:
        _sweep_temps(engine, catalog, state, manifest)
    plan = make_plan(engine, catalog, state, old_raw, manifest, add, remove, force)
    if not dry_run:
        carry_out(state, plan)
    before = list(manifest.patches) if manifest is not None and not stale else []
    return Result(engine, plan.target_ids, plan.changes, dry_run, applied_before=before)


def carry_out(state: StateDir, plan: Plan) -> None:
    """Do what ``plan`` says, all or nothing (see :func:`write_all_or_nothing`)."""
    if plan.clear_state == "stale":
        state.clear()
    elif plan.clear_state == "orphans":
        with contextlib.suppress(OSError, PatchError):
            clear_orphans(state, Path(plan.package_dir))
    if plan.write is not None:
        write = plan.write
        write_all_or_nothing(state, write.old_raw, write.journal, write.final, plan.changes, write.new_backups,
                             write.package_dir, write.backup_modes)


def _sweep_temps(engine: InstalledEngine, catalog: Catalog, state: StateDir, manifest: Manifest | None) -> None:
    """Temp files a killed run staged but never renamed: they hold no truth, delete them."""
    relpaths = catalog.relpaths()
    relpaths |= set(manifest.files if manifest else ())
    directories = {engine_file(engine, r).parent for r in relpaths} | {state.backup_path(r).parent for r in relpaths}
    for directory in sorted(directories | {state.root}):
        with contextlib.suppress(OSError):
            fs.remove_stale_temps(directory)


def applied_ids(engine: InstalledEngine) -> list[str]:
    manifest = StateDir(engine.site_dir, engine.engine).read_manifest()
    if manifest is None or stale_manifest(engine, manifest):
        return []
    return list(manifest.patches)


def _named(engine: InstalledEngine, catalog: Catalog | None, patches: Sequence[Patch] | None
           ) -> tuple[Catalog, list[Patch] | None]:
    """The engine's catalog (read here only for a caller below a command's edge) and the named patches
    in the order they apply in (None: every patch). The patches come resolved (``patch_registry.select``
    at a command's edge, ``Catalog.select`` in a test or script): an id is never looked up here."""
    if catalog is None:
        catalog = patch_registry.catalog(engine.engine)
    if patches is None:
        return catalog, None
    if not patches:
        raise UsageError(f"no patch of {engine.engine} named")
    ids = [p for p in patches if isinstance(p, str)]
    if ids:
        raise TypeError(f"the patch engine takes Patch objects, not ids ({', '.join(map(repr, ids))}): "
                        "resolve them at the edge (patch_registry.select, or Catalog.select)")
    foreign = [p.id for p in patches if p not in catalog.patches]
    if foreign:
        raise UsageError(f"not a registered patch of {engine.engine}: {', '.join(foreign)}")
    return catalog, [p for p in catalog.patches if p in patches]


def apply(
    engine: InstalledEngine,
    patches: Sequence[Patch] | None = None,
    *,
    catalog: Catalog | None = None,
    force: bool = False,
    dry_run: bool = False,
    allow_unknown_version: bool = False,
    allow_editable: bool = False,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> Result:
    """Apply ``patches`` (None: every patch for this engine version) on top of what is applied."""
    catalog, named = _named(engine, catalog, patches)
    candidates, skipped = applicable(engine, catalog.patches, named, allow_unknown_version)
    if not candidates:
        no_release = not_a_release(engine.version)  # a build that is no release is proved by none
        raise PatchError(f"no patch supports {engine.distribution} {engine.version}"
                         + (f" ({no_release})" if no_release else "")
                         + " (see `toolkit list`; --allow-unknown-version, allow_unknown_version=True in Python, "
                         "tries anyway)")
    _require_runtime(engine, candidates)
    result = reconcile(engine, catalog, add=candidates, force=force, dry_run=dry_run, allow_editable=allow_editable,
                       lock_timeout=lock_timeout)
    result.skipped = skipped
    return result


def _require_runtime(engine: InstalledEngine, patches: Sequence[Patch]) -> None:
    """A patch whose edits import its runtime module needs that module importable by the engine's
    interpreter: this project at this version for ours, the patch's own package for another
    distribution's. Otherwise the patched engine would start as the release (the guarded import) or
    not at all. Checked before anything is written (``--python`` into another environment)."""
    if engine.toolkit_version is None:  # the running interpreter: it loaded every registered patch
        return
    ours = [p.id for p in patches if any(m.startswith("toolkit.") for m in p.runtime_modules)]
    if ours and engine.toolkit_version != __version__:
        found = f"serving-toolkit {engine.toolkit_version}" if engine.toolkit_version else "no serving-toolkit"
        raise PatchError(
            f"{engine.python} has {found}, but the patched {engine.engine} would import this project's runtime "
            f"modules ({', '.join(ours)}) at start-up; install it there first "
            f"(`{engine.python} -m pip install 'serving-toolkit=={__version__}'`); nothing was written")
    theirs = {m.partition(".")[0]: p.id for p in patches for m in p.runtime_modules if not m.startswith("toolkit.")}
    if theirs:
        from toolkit.engine.discovery import missing_packages

        missing = missing_packages(engine.python, sorted(theirs))
        if missing:
            named = ", ".join(f"{theirs[name]} ({name})" for name in missing)
            raise PatchError(
                f"{engine.python} cannot import the runtime of patch {named}, which the patched {engine.engine} "
                "would import at start-up; install the package that ships it there first; nothing was written")


def revert(engine: InstalledEngine, patches: Sequence[Patch] | None = None, *, catalog: Catalog | None = None,
           force: bool = False, dry_run: bool = False, lock_timeout: float = DEFAULT_LOCK_TIMEOUT) -> Result:
    """Revert ``patches`` (None: all); the others stay applied. Originals come back byte-for-byte;
    with ``force``, only the files of the reverted patches are overwritten."""
    catalog, named = _named(engine, catalog, patches)
    return reconcile(engine, catalog, remove=named, force=force, dry_run=dry_run, lock_timeout=lock_timeout)


def status(engine: InstalledEngine, *, catalog: Catalog | None = None) -> list[PatchState]:
    """Hash-only state of every patch of ``engine`` (see :mod:`toolkit.engine.status`)."""
    return _status(engine, catalog or patch_registry.catalog(engine.engine))
