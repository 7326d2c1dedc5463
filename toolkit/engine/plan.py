"""Planning a change: from the manifest, the files' hashes and (only when something changes) the
codemods, what one apply or revert will write. Making a plan writes nothing (``journal`` does)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from toolkit.engine import fs
from toolkit.kit._declare import FileEdit, Patch
from toolkit.engine.discovery import EDITABLE, InstalledEngine
from toolkit.errors import DriftError, PatchError
from toolkit.engine.overlap import refuse_unordered
from toolkit.base.cache_files import FILE_MODE
from toolkit.engine.state import RECOVER, FileRecord, Manifest, StateDir, sha256_bytes, sha256_file
from toolkit.base.version import __version__
from toolkit.engine.journal import FileChange, read_or_none
from toolkit.patch_registry import Catalog, markers_in


def engine_file(engine: InstalledEngine, relpath: str) -> Path:
    return _engine_file(str(engine.package_dir), relpath)


@functools.lru_cache(maxsize=4096)  # asked for each file many times a command; a Path never changes
def _engine_file(package_dir: str, relpath: str) -> Path:
    return Path(package_dir) / relpath


def check_install(engine: InstalledEngine, allow_editable: bool) -> None:
    """An editable install's files are the user's own checkout: patching them rewrites their work tree
    (a ``git diff`` full of our edits), so only on request."""
    if engine.install_kind == EDITABLE and not allow_editable:
        raise PatchError(
            f"{engine.distribution} {engine.version} at {engine.package_dir} is an editable install (pip's "
            "direct_url.json says so), so patching it would rewrite your own checkout; allow it with "
            "--allow-editable (allow_editable=True in Python; revert restores the files byte for byte); "
            "nothing was written")


def edited_files(engine: InstalledEngine, catalog: Catalog) -> set[str]:
    """Every file one of the engine's registered patches edits on its version."""
    return {edit.relpath for patch in catalog.patches for edit in patch.files_for(engine.version)}


def refuse_links(engine: InstalledEngine, relpaths: Iterable[str]) -> None:
    """A symbolic link at the package directory, or at any folder or file on the way to a file in
    ``relpaths``, or at the ``__pycache__`` beside it, is refused before anything is written: a rename over
    a link leaves a regular file (with the link's mode, 0777) and never the link again, a linked folder
    puts the files outside site-packages, out of reach of the backups' relative path and of pip's RECORD
    beside them, and a linked ``__pycache__`` would have bytecode deleted outside them. A link that appears
    later, while the run writes, is refused by the writes themselves (``fs.confined``)."""
    checked: set[str] = set()
    for relpath in sorted(relpaths):
        path = engine_file(engine, relpath)
        folder = str(path.parent)  # the folders of most files are those of the file before
        link = None
        if folder not in checked:
            link = fs.first_link(engine.site_dir, folder) or fs.first_link(folder, path.parent / "__pycache__")
        checked.add(folder)
        link = link or fs.first_link(folder, path)
        if link is not None:
            raise link_refused(engine, link)


def link_refused(engine: InstalledEngine, link: str | None) -> PatchError:
    """The refusal of a symbolic link found where a run reads a file's mode, writes or deletes."""
    return PatchError(
        f"{link} is a symbolic link in {engine.distribution} {engine.version}; toolkit writes only real "
        f"files inside {engine.site_dir}, never through or over a link (a link would come back as a "
        "regular file, a linked folder would put the files outside site-packages): replace the link by "
        "a copy of what it points to and run the command again; nothing was written")


def file_state(current: str | None, record: FileRecord) -> str:
    if current is None:
        return "missing"
    if current == record.after:
        return "patched"
    if current == record.before:
        return "original"
    if current in record.prior:
        return "midway"
    return "drifted"


def stale_manifest(engine: InstalledEngine, manifest: Manifest) -> bool:
    """The manifest belongs to another install (the engine was reinstalled since), decided from the
    files, never from the label alone: a dist-info whose name or version changed (a local tag edited
    out of METADATA, a second distribution's dist-info beside the package) over files that still hold
    bytes this manifest wrote is the same install, and its backups are the only originals there are.
    Stale = another label and no recorded file holding a patch's bytes (its ``after`` or, from an
    interrupted run, a ``prior``): only then may ``revert --force`` forget the state and the backups."""
    if manifest.engine_version == engine.version and manifest.distribution == engine.distribution:
        return False
    return not still_patched(engine, manifest)


def still_patched(engine: InstalledEngine, manifest: Manifest) -> list[str]:
    """The recorded files that hold bytes a patch of ``manifest`` wrote (hashes only)."""
    held = []
    for relpath, record in sorted(manifest.files.items()):
        written = {record.after, *record.prior} - {record.before}  # a record's release bytes are nobody's edit
        if sha256_file(engine_file(engine, relpath)) in written:
            held.append(relpath)
    return held


def _refuse_marked(catalog: Catalog, relpath: str, data: bytes, manifest: Manifest | None) -> None:
    """A file read from the engine as its original must carry no patch's marker: patching it again
    would double the edit, and backing it up would lose the real original."""
    found = sorted(markers_in(data) & set(catalog.ids))
    if found:
        why = "there is no toolkit manifest" if manifest is None else "the manifest does not record it"
        raise PatchError(
            f"{relpath} already carries the marker of patch {', '.join(found)} but {why}; nothing was "
            f"written. {RECOVER}"
        )


def _decode(patch: Patch, relpath: str, data: bytes, engine: InstalledEngine) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PatchError(f"patch {patch.id}: {relpath} is not UTF-8 text ({engine.engine} {engine.version}): {exc}") \
            from None


def _recorded_original(engine: InstalledEngine, state: StateDir, relpath: str, record: FileRecord) -> bytes:
    """The original bytes of a recorded file: its backup, or, for a file a stopped repair recorded as
    the release's (no patch, nothing backed up), the file itself once it has those bytes."""
    if not record.patches and record.before == record.after:
        data = state.read_backup_or_none(relpath)
        if data is None or sha256_bytes(data) != record.before:
            data = read_or_none(engine_file(engine, relpath))
        if data is not None and sha256_bytes(data) == record.before:
            return data
    return state.read_backup(relpath, record.before)


def _wanted_contents(
    engine: InstalledEngine, catalog: Catalog, state: StateDir, manifest: Manifest | None, target: list[Patch],
    scope: set[str], modes: dict[str, int],
) -> tuple[dict[str, bytes], dict[str, bytes], dict[str, list[str]]]:
    """Original and wanted bytes of every file in ``scope``, and which patches edit it; ``modes`` gets the
    mode of each original read from the engine (its backup keeps it)."""
    edits_by_file: dict[str, list[tuple[Patch, FileEdit]]] = {}
    for patch in target:
        for edit in patch.files_for(engine.version):
            if edit.relpath in scope:
                edits_by_file.setdefault(edit.relpath, []).append((patch, edit))
    originals: dict[str, bytes] = {}
    for relpath in sorted(scope):
        record = manifest.files.get(relpath) if manifest else None
        if record is not None:
            originals[relpath] = _recorded_original(engine, state, relpath, record)
            continue
        path = engine_file(engine, relpath)
        try:
            originals[relpath], modes[relpath] = fs.read_file(path)
        except (FileNotFoundError, NotADirectoryError):
            owner = edits_by_file[relpath][0][0].id if relpath in edits_by_file else "?"
            raise PatchError(
                f"patch {owner}: file {relpath} not found in {engine.package_dir} "
                f"({engine.engine} {engine.version}); nothing was written"
            ) from None
        _refuse_marked(catalog, relpath, originals[relpath], manifest)
    wanted: dict[str, bytes] = {}
    patch_ids: dict[str, list[str]] = {}
    for relpath, original in originals.items():
        ids: list[str] = []
        text = ""
        # (patch, its input, its output): the last output is guarded, which adds only the module-level
        # helper `_toolkit_release`, never an edit to an engine function
        steps: list[tuple[str, str, str]] = []
        edits = edits_by_file.get(relpath, [])
        for index, (patch, edit) in enumerate(edits):
            if not ids:
                text = _decode(patch, relpath, original, engine)
            # libcst: only when a file is rewritten
            from toolkit.engine.guard import backup_relative_to, guard_module
            from toolkit.engine.transform import transform_or_raise

            finish = None
            if index == len(edits) - 1:  # last: guard the runtime imports (a patched engine without us starts)
                backup = backup_relative_to(engine_file(engine, relpath), state.backup_path(relpath))
                finish = functools.partial(guard_module, engine=engine.engine, backup=backup)
            before, text = text, transform_or_raise(patch, edit, text, engine.version, finish).after
            steps.append((patch.id, before, text))
            ids.append(patch.id)
        refuse_unordered(relpath, steps, catalog.ordered_between, engine.engine, engine.version)
        wanted[relpath] = text.encode("utf-8") if ids else original
        patch_ids[relpath] = ids
    return originals, wanted, patch_ids


def _already_done(engine: InstalledEngine, manifest: Manifest | None, target: list[Patch], target_ids: list[str]) -> bool:
    """Nothing to do, decided from hashes alone (no codemod runs, so the lock is held for milliseconds)."""
    if manifest is None:
        return not target_ids
    if manifest.state != "applied" or manifest.patches != target_ids:
        return False
    if len(target) != len(target_ids):
        return False  # a patch this toolkit does not know: the full path says so in a sentence
    edited = {edit.relpath for p in target for edit in p.files_for(engine.version)}
    if not edited <= set(manifest.files):
        return False
    return all(sha256_file(engine_file(engine, r)) == rec.after for r, rec in manifest.files.items())


@dataclass
class Write:
    """The journaled write of a plan: backups, files, journal, renames, final manifest (``write_all_or_nothing``)."""

    old_raw: bytes | None
    journal: Manifest
    final: Manifest | None
    new_backups: dict[str, bytes]
    package_dir: Path | None = None  # where the files the new backups back are
    backup_modes: dict[str, int] = field(default_factory=dict)  # each new backup's mode (default 0644)


@dataclass
class Plan:
    """What one run will do, decided from the manifest, the files' hashes and (only when something
    changes) the transforms. Making a plan writes nothing; :func:`carry_out` does it."""

    target_ids: list[str]  # the patches applied afterwards
    changes: list[FileChange] = field(default_factory=list)
    write: Write | None = None
    # state no manifest owns: "stale" (another install's, dropped; failures raise) or "orphans"
    # (backups a run could not tidy after its commit; dropped if possible)
    clear_state: str = ""
    package_dir: str = ""


def make_plan(
    engine: InstalledEngine, catalog: Catalog, state: StateDir, old_raw: bytes | None, manifest: Manifest | None,
    add: Sequence[Patch], remove: Sequence[Patch] | None, force: bool,
) -> Plan:
    """The plan for applying ``add`` and reverting ``remove`` (None: all), patches of ``catalog``; raises on
    drift. The patches come resolved: only the ids the manifest records are matched to the catalog
    (``Catalog.recorded``), and nothing below works on an id but the manifest's own bookkeeping."""
    reverting = remove is None or bool(remove)
    if manifest is not None and stale_manifest(engine, manifest):
        if not (reverting and force):
            raise DriftError(
                f"{engine.engine} was reinstalled ({manifest.distribution} {manifest.engine_version} "
                f"was patched, {engine.distribution} {engine.version} is installed now, and no file holds the "
                "patches); run `toolkit revert --force` (revert_patch(force=True) in Python) to forget the old "
                "patch state",
                sorted(manifest.files),
            )
        # the backups belong to another install: never restore them here; and stale_manifest found no file
        # holding a patch's bytes, so no backup dropped here is the original of a patched file
        return Plan([], clear_state="stale")

    applied_before = list(manifest.patches) if manifest else []
    recorded, unknown = catalog.recorded(applied_before)
    target = [] if remove is None else catalog.ordered((set(recorded) | set(add)) - set(remove))
    kept_unknown = [] if remove is None else unknown  # not this toolkit's patches: they stay, so refused below
    target_ids = [p.id for p in target] + kept_unknown
    if manifest is None:
        _refuse_unrecorded_marks(engine, catalog, reverting)
    if not force and _already_done(engine, manifest, target, target_ids):
        return Plan(target_ids, clear_state="orphans" if manifest is None else "", package_dir=engine.package_dir)
    if manifest is not None and kept_unknown:
        _refuse_foreign(engine, kept_unknown, manifest.toolkit_version)

    # Which files to look at: those of the patches that change, or every one when a run was
    # interrupted or nothing changes (a rerun that finishes or re-checks the job).
    changing = set(target_ids) ^ set(applied_before)
    every_file = ({e.relpath for p in target for e in p.files_for(engine.version)}
                  | set(manifest.files if manifest else ()))
    if manifest is None or manifest.state != "applied" or not changing:
        scope = every_file
    else:
        scope = {e.relpath for p in set(target) ^ set(recorded) for e in p.files_for(engine.version)}
        scope = (scope | {r for r, rec in manifest.files.items() if set(rec.patches) & changing}) & every_file
    modes: dict[str, int] = {}
    originals, wanted, patch_ids = _wanted_contents(engine, catalog, state, manifest, target, scope, modes)

    current_sha = {relpath: sha256_file(engine_file(engine, relpath)) for relpath in wanted}
    _refuse_drift(engine, manifest, originals, current_sha, force, reverting)

    changes = []
    for relpath, data in sorted(wanted.items()):
        if current_sha[relpath] != sha256_bytes(data):
            path = engine_file(engine, relpath)
            current, mode = fs.read_or_none_with_mode(path)  # the file's own mode, never a link's
            changes.append(FileChange(relpath, path, current, data, FILE_MODE if mode is None else mode))
    # the registered patches' files were looked at before the lock (engine.reconcile); a file only the
    # manifest names (a patch no longer registered) is looked at here, still before any write
    refuse_links(engine, {change.relpath for change in changes} - edited_files(engine, catalog))

    # the manifest afterwards: files outside the scope keep their records as they are
    final_files = {r: rec for r, rec in (manifest.files.items() if manifest else ()) if r not in scope}
    for relpath in scope:
        if patch_ids[relpath]:
            final_files[relpath] = FileRecord(sha256_bytes(originals[relpath]), sha256_bytes(wanted[relpath]),
                                              patch_ids[relpath])
    final = None
    if target_ids:
        final = Manifest(__version__, engine.engine, engine.distribution, engine.version, "applied", target_ids,
                         final_files)
    if not changes and _same_manifest(manifest, final):
        return Plan(target_ids, changes)

    # While writing, every patch that is or was applied counts as (partly) applied, so that `status`
    # after a crash says "partial" for each, never "not applied".
    journal = Manifest(__version__, engine.engine, engine.distribution, engine.version,
                       "reverting" if reverting else "applying",
                       catalog.order(set(target_ids) | set(applied_before)), dict(final_files))
    for relpath in scope:
        old = manifest.files.get(relpath) if manifest else None
        after = sha256_bytes(wanted[relpath])
        prior = sorted(({old.after, *old.prior} if old else set()) - {after})
        journal.files[relpath] = FileRecord(sha256_bytes(originals[relpath]), after, patch_ids[relpath], prior)
    new_backups = {r: originals[r] for r in scope if patch_ids[r] and not (manifest and r in manifest.files)}
    # a backup is never more open than its file (a 0600 release file's backup is 0600), nor than 0644
    backup_modes = {r: modes.get(r, FILE_MODE) & FILE_MODE for r in new_backups}
    return Plan(target_ids, changes, Write(old_raw, journal, final, new_backups, Path(engine.package_dir),
                                           backup_modes))


def _refuse_unrecorded_marks(engine: InstalledEngine, catalog: Catalog, reverting: bool) -> None:
    """Patched files with no manifest: their originals are known only to the backups, which are
    never dropped (or trusted) without one. Say so and stop, whatever was asked."""
    ours = set(catalog.ids)
    marked: dict[str, set[str]] = {}
    for relpath in sorted(catalog.relpaths()):
        try:
            found = markers_in(fs.read_bytes(engine_file(engine, relpath))) & ours
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            continue
        if found:
            marked[relpath] = found
    if marked:
        ids = sorted(set().union(*marked.values()))
        verb = "revert them" if reverting else "patch them again"
        raise PatchError(
            f"{engine.engine} {engine.version}: {', '.join(marked)} carry the marker of patch {', '.join(ids)} but "
            f"the toolkit manifest is missing, so toolkit cannot {verb} safely; nothing was changed and the backups "
            f"are kept. {RECOVER}")


def _refuse_drift(engine: InstalledEngine, manifest: Manifest | None, originals: dict[str, bytes],
                  current_sha: dict[str, str | None], force: bool, reverting: bool) -> None:
    """Files changed since patched are left alone unless forced."""
    drifted: list[str] = []
    deleted: list[str] = []
    for relpath, current in current_sha.items():
        record = manifest.files.get(relpath) if manifest else None
        if record is not None and file_state(current, record) in ("drifted", "missing"):
            (deleted if current is None else drifted).append(relpath)
        elif record is None and current != sha256_bytes(originals[relpath]):
            drifted.append(relpath)  # cannot happen for a file read just now, unless racing
    if (drifted or deleted) and not force:
        verb = "revert" if reverting else "apply-patch"
        what = "; ".join([f"changed since patched: {', '.join(sorted(drifted))}"] * bool(drifted)
                         + [f"deleted since patched: {', '.join(sorted(deleted))}"] * bool(deleted))
        raise DriftError(
            f"{engine.engine} {engine.version}: {what} (left alone; `toolkit {verb} --force`, "
            f"{'revert_patch' if reverting else 'apply_patch'}(force=True) in Python, overwrites them)",
            sorted(drifted + deleted),
        )


def _same_manifest(manifest: Manifest | None, final: Manifest | None) -> bool:
    if manifest is None or final is None:
        return manifest is final
    final.updated_at = manifest.updated_at
    return manifest.to_json() == final.to_json()


def _refuse_foreign(engine: InstalledEngine, foreign: Sequence[str], by_version: str) -> None:
    """A patch applied by another toolkit, one since removed from this one, or another package's patch
    whose package is gone can be neither kept nor re-derived here; dropping it silently would revert it
    behind the user's back."""
    if foreign:
        raise PatchError(
            f"{engine.engine} {engine.version} has patches applied that this toolkit {__version__} does "
            f"not know: {', '.join(foreign)} (applied by toolkit {by_version}; a patch package since "
            "uninstalled, or another toolkit release); run `toolkit revert` first, which restores the originals"
        )
