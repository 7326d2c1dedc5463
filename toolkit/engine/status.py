"""``toolkit status``: each patch's state from hashes alone (no codemod runs, no lock taken)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from toolkit.engine import fs
from toolkit.kit._declare import Patch
from toolkit.engine.discovery import InstalledEngine
from toolkit.errors import CorruptManifest, PatchError
from toolkit.engine.state import RECOVER, Manifest, StateDir, sha256_bytes, sha256_file
from toolkit.base.version import __version__
from toolkit.patch_registry import Catalog, markers_in
from toolkit.engine.plan import engine_file, file_state, stale_manifest


class PatchStateName(str, Enum):
    """A patch's state in ``status``; its value is what the CLI and ``--json`` show."""

    NOT_APPLIED = "not applied"
    APPLIED = "applied"
    PARTIAL = "partial"  # an apply or revert was interrupted
    DRIFTED = "drifted"
    IN_PROGRESS = "in progress"  # another run holds the lock: its files are in flight, not broken
    # Patched, but the engine's interpreter cannot import this project's runtime at this version (it
    # was uninstalled or upgraded without a revert): the engine runs the release's files, with a warning.
    RUNTIME_MISSING = "runtime missing"
    NO_MANIFEST = "patched, no manifest"  # the files carry the patch's marker; the manifest is gone or unreadable

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


NOT_APPLIED = PatchStateName.NOT_APPLIED


APPLIED = PatchStateName.APPLIED


PARTIAL = PatchStateName.PARTIAL


DRIFTED = PatchStateName.DRIFTED


IN_PROGRESS = PatchStateName.IN_PROGRESS


RUNTIME_MISSING = PatchStateName.RUNTIME_MISSING


NO_MANIFEST = PatchStateName.NO_MANIFEST


@dataclass
class PatchState:
    engine: str
    distribution: str
    engine_version: str
    patch_id: str
    state: PatchStateName
    supported: bool
    files: dict[str, str]  # relpath -> "patched" / "original" / "drifted" / "missing"
    detail: str = ""
    install_kind: str = "index"  # how the engine was installed (toolkit.engine.discovery.install_kind)


def status(engine: InstalledEngine, catalog: Catalog) -> list[PatchState]:
    """Hash-only state of every patch of ``catalog`` on ``engine``: no parsing of sources, no lock taken.

    Without a readable manifest, the files speak for themselves: a patch whose files carry its
    marker is reported as ``patched, no manifest``."""
    state_dir = StateDir(engine.site_dir, engine.engine)
    holder = state_dir.holder()
    problem = ""
    try:
        manifest = state_dir.read_manifest()
    except CorruptManifest as exc:
        manifest, problem = None, str(exc)
    stale = manifest is not None and stale_manifest(engine, manifest)
    rows = []
    for patch in catalog.patches:
        files: dict[str, str] = {}
        detail = ""
        if manifest is None:
            state, detail, files = _state_from_markers(engine, patch, problem)
        elif patch.id not in manifest.patches:
            state = NOT_APPLIED
        elif stale:
            state = DRIFTED
            # stale_manifest: no recorded file holds a patch's bytes, so forgetting the backups loses nothing
            detail = (f"patched as {manifest.distribution} {manifest.engine_version}; engine reinstalled since (no "
                      f"file holds the patches now): `toolkit revert {engine.engine} --force` forgets the old "
                      "patch state")
        else:
            for edit in patch.files_for(engine.version):
                record = manifest.files.get(edit.relpath)
                current = sha256_file(engine_file(engine, edit.relpath))
                files[edit.relpath] = file_state(current, record) if record else "unrecorded"
            values = set(files.values())
            if manifest.state == "applied" and values == {"patched"}:
                state = APPLIED
            elif manifest.state == "applied" and values == {"original"}:
                state = DRIFTED
                detail = ("its files are the release's originals again (engine reinstalled?); `toolkit apply-patch` "
                          "patches them again, `toolkit revert` forgets the state")
            elif manifest.state == "applied" or values & {"drifted", "missing", "unrecorded"}:
                state = DRIFTED
                detail = drift_detail(files)
            else:
                state = PARTIAL
                verb = "an apply" if manifest.state == "applying" else "a revert"
                detail = f"{verb} was interrupted; run apply-patch or revert to finish"
        relabelled = manifest is not None and not stale and (manifest.distribution, manifest.engine_version) != (
            engine.distribution, engine.version)
        if relabelled and manifest is not None and not detail and patch.id in manifest.patches:  # the files decide (plan.stale_manifest)
            detail = (f"patched as {manifest.distribution} {manifest.engine_version}; the metadata now says "
                      f"{engine.distribution} {engine.version} over the same patched files")
        if manifest is not None and not stale and state in (APPLIED, PARTIAL):
            lost = _unusable_backups(state_dir, manifest, [e.relpath for e in patch.files_for(engine.version)])
            if lost:
                state = DRIFTED
                detail = f"the backup of {', '.join(lost)} is missing or altered, so revert cannot restore it; {RECOVER}"
        if holder is not None and state not in (APPLIED, NOT_APPLIED):
            state, detail = IN_PROGRESS, f"in progress (pid {holder})"
        if state == APPLIED:
            gone = _runtime_gone(engine, patch)
            if gone:
                state, detail = RUNTIME_MISSING, gone
        rows.append(
            PatchState(engine.engine, engine.distribution, engine.version, patch.id, state,
                       patch.supports(engine.version), files, detail, engine.install_kind)
        )
    return rows + _unknown_applied(engine, catalog, manifest, stale)


def _runtime_gone(engine: InstalledEngine, patch: Patch) -> str:
    """Why ``engine``'s interpreter (probed with ``--python``) cannot run ``patch``'s runtime, or "":
    this project at this version for our patches, the patch's own package for another distribution's."""
    if engine.toolkit_version is None:  # the running interpreter: it loaded every registered patch
        return ""
    revert = f"`toolkit revert {engine.engine} --python {engine.python}`"
    if any(m.startswith("toolkit.") for m in patch.runtime_modules) and engine.toolkit_version != __version__:
        fix = f"`{engine.python} -m pip install 'serving-toolkit=={__version__}'` there, or {revert}"
        if engine.toolkit_version:
            return (f"{engine.python} has serving-toolkit {engine.toolkit_version}, but the patched files were "
                    f"written for {__version__}'s runtime; {fix}")
        return (f"{engine.python} has no serving-toolkit importable: the patched files run as the release "
                f"wrote them (the patches are off, with a warning at start-up); {fix}")
    theirs = sorted({m.partition(".")[0] for m in patch.runtime_modules if not m.startswith("toolkit.")})
    if theirs:
        from toolkit.engine.discovery import missing_packages

        missing = missing_packages(engine.python, theirs)
        if missing:
            return (f"{engine.python} cannot import {', '.join(missing)}, the runtime of {patch.id}: the patched "
                    f"files run as the release wrote them (the patch is off, with a warning at start-up); install "
                    f"the package that ships it there, or {revert}")
    return ""


def _unknown_applied(engine: InstalledEngine, catalog: Catalog, manifest: Manifest | None,
                     stale: bool) -> list[PatchState]:
    """A row for each patch the manifest records that no registered patch is now (its package was
    uninstalled, or another toolkit release applied it): its edits are still in the files, so it is
    never left out of `status`."""
    if manifest is None or stale:
        return []
    rows = []
    for patch_id in manifest.patches:
        if patch_id in catalog.ids:
            continue
        files = {relpath: file_state(sha256_file(engine_file(engine, relpath)), record)
                 for relpath, record in sorted(manifest.files.items()) if patch_id in record.patches}
        where = f" --python {engine.python}" if engine.toolkit_version is not None else ""  # probed: another python
        detail = (f"its edits are still in the files, but no installed package registers {patch_id} now (applied by "
                  f"toolkit {manifest.toolkit_version}; its package uninstalled?): reinstall that package to keep it, "
                  f"or `toolkit revert {engine.engine}{where}` puts back the release's files (every patch reverted; "
                  f"`toolkit apply-patch {engine.engine}{where}` applies the registered ones again)")
        rows.append(PatchState(engine.engine, engine.distribution, engine.version, patch_id, DRIFTED, False, files,
                               detail, engine.install_kind))
    return rows


def _unusable_backups(state_dir: StateDir, manifest: Manifest, relpaths: list[str]) -> list[str]:
    lost = []
    for relpath in relpaths:
        record = manifest.files.get(relpath)
        if record is None:
            continue
        try:
            data = state_dir.read_backup_or_none(relpath)
        except (OSError, PatchError):
            data = None
        if data is None or sha256_bytes(data) != record.before:
            lost.append(relpath)
    return lost


def drift_detail(files: dict[str, str]) -> str:
    """What happened to each file not as patched: a deleted file is said to be deleted, not changed."""
    changed = [r for r, s in files.items() if s not in ("patched", "missing")]
    deleted = [r for r, s in files.items() if s == "missing"]
    return "; ".join([f"changed since patched: {', '.join(changed)}"] * bool(changed)
                     + [f"deleted since patched: {', '.join(deleted)}"] * bool(deleted))


def _state_from_markers(engine: InstalledEngine, patch: Patch, problem: str) -> tuple[PatchStateName, str, dict[str, str]]:
    files = {}
    for edit in patch.files_for(engine.version):
        try:
            data = fs.read_bytes(engine_file(engine, edit.relpath))
        except OSError:
            files[edit.relpath] = "missing"
            continue
        files[edit.relpath] = "patched" if patch.id in markers_in(data) else "original"
    marked = [r for r, s in files.items() if s == "patched"]
    if not marked:
        return NOT_APPLIED, problem, files
    why = problem or "the toolkit manifest is missing"
    if len(marked) == len(files):
        return NO_MANIFEST, f"its files carry its marker but {why}; {RECOVER}", files
    return PARTIAL, f"some of its files carry its marker but {why}; {RECOVER}", files
