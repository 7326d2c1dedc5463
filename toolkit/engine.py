"""The patch engine: apply, revert, status and check, for any patch of any supported engine.

Every change goes through one reconciliation: given the patches that should be applied to an engine
install, derive each edited file's wanted bytes from its pristine original (the backup), then write
only what differs. Applying more patches and reverting some or all of them are the same operation
with a different target set, so the order of earlier applies never matters.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import re
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Callable, Iterable, Sequence

from toolkit import fs, interrupts
from toolkit.declare import FileEdit, Patch
from toolkit.discovery import InstalledEngine
from toolkit.errors import CorruptManifest, DriftError, PatchError, UsageError, io_error
from toolkit.sources import SourceTree
from toolkit.state import (FILE_MODE, RECOVER, FileRecord, Manifest, StateDir, remove_stale_bytecode, sha256_bytes,
                           sha256_file)
from toolkit.version import __version__

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

DEFAULT_LOCK_TIMEOUT = 60.0


def registry() -> list[Patch]:
    from toolkit.patches import all_patches

    return all_patches()


def patches_for(engine: str, patch_ids: Sequence[str] | None = None) -> list[Patch]:
    """The engine's patches in registry order; unknown ids are a usage error."""
    known = registry()
    if patch_ids:
        by_id = {p.id for p in known if p.engine == engine}
        unknown = [pid for pid in patch_ids if pid not in by_id]
        if unknown:
            raise UsageError(
                f"unknown patch for {engine}: {', '.join(unknown)} (known: {', '.join(sorted(by_id)) or 'none'})"
            )
    return [p for p in known if p.engine == engine and (not patch_ids or p.id in patch_ids)]


@dataclass
class FileChange:
    relpath: str
    path: Path
    current: bytes | None
    wanted: bytes
    mode: int = FILE_MODE  # the current file's (kept), 0644 for a file that is missing

    def diff(self) -> str:
        before = (self.current or b"").decode("utf-8", errors="replace").splitlines(keepends=True)
        after = self.wanted.decode("utf-8", errors="replace").splitlines(keepends=True)
        return "".join(difflib.unified_diff(before, after, f"a/{self.relpath}", f"b/{self.relpath}"))


@dataclass
class Result:
    """What an apply or revert did (or, with dry_run, would do)."""

    engine: InstalledEngine
    patches: list[str]  # the patches applied to the engine afterwards
    changed: list[FileChange] = field(default_factory=list)
    dry_run: bool = False

    @property
    def changed_files(self) -> list[str]:
        return [change.relpath for change in self.changed]

    def diff(self) -> str:
        return "".join(change.diff() for change in self.changed)


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


# --------------------------------------------------------------------------------------------------
# planning


def _engine_file(engine: InstalledEngine, relpath: str) -> Path:
    return Path(engine.package_dir) / relpath


def _check_versions(engine: InstalledEngine, patches: Iterable[Patch], allow_unknown_version: bool) -> None:
    for patch in patches:
        why = patch.not_needed_on(engine.version)
        if why:
            raise PatchError(f"patch {patch.id} is not needed on {engine.distribution} {engine.version}: {why}; "
                             "nothing was written")
        if not patch.supports(engine.version) and not allow_unknown_version:
            raise PatchError(
                f"patch {patch.id} supports {engine.engine} {patch.versions_text}, "
                f"but {engine.distribution} {engine.version} is installed at {engine.package_dir}; "
                "allow unknown versions to try anyway (--allow-unknown-version, allow_unknown_version=True in "
                "Python; it still fails on any missing anchor)"
            )


def _file_state(current: str | None, record: FileRecord) -> str:
    if current is None:
        return "missing"
    if current == record.after:
        return "patched"
    if current == record.before:
        return "original"
    if current in record.prior:
        return "midway"
    return "drifted"


def _stale_manifest(engine: InstalledEngine, manifest: Manifest) -> bool:
    return manifest.engine_version != engine.version or manifest.distribution != engine.distribution


MARKER = re.compile(rb"# toolkit:([A-Za-z0-9_.-]+)")


def markers_in(data: bytes) -> set[str]:
    """The patch ids whose marker comment (``# toolkit:<id>``) a file carries."""
    return {match.decode() for match in MARKER.findall(data)}


def _registry_order(engine: str, ids: Iterable[str]) -> list[str]:
    wanted = set(ids)
    known = [p.id for p in registry() if p.engine == engine and p.id in wanted]
    return known + sorted(wanted - set(known))  # ids this toolkit does not know stay visible


def _refuse_marked(engine: InstalledEngine, relpath: str, data: bytes, manifest: Manifest | None) -> None:
    """A file read from the engine as its original must carry no patch's marker: patching it again
    would double the edit, and backing it up would lose the real original."""
    ours = {p.id for p in registry() if p.engine == engine.engine}
    found = sorted(markers_in(data) & ours)
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
            data = _read_or_none(_engine_file(engine, relpath))
        if data is not None and sha256_bytes(data) == record.before:
            return data
    return state.read_backup(relpath, record.before)


def _wanted_contents(
    engine: InstalledEngine, state: StateDir, manifest: Manifest | None, target: list[Patch], scope: set[str]
) -> tuple[dict[str, bytes], dict[str, bytes], dict[str, list[str]]]:
    """Original and wanted bytes of every file in ``scope``, and which patches edit it."""
    edits_by_file: dict[str, list[tuple[Patch, FileEdit]]] = {}
    for patch in target:
        for edit in patch.files:
            if edit.relpath in scope:
                edits_by_file.setdefault(edit.relpath, []).append((patch, edit))
    originals: dict[str, bytes] = {}
    for relpath in sorted(scope):
        record = manifest.files.get(relpath) if manifest else None
        if record is not None:
            originals[relpath] = _recorded_original(engine, state, relpath, record)
            continue
        path = _engine_file(engine, relpath)
        try:
            originals[relpath] = fs.read_bytes(path)
        except (FileNotFoundError, NotADirectoryError):
            owner = edits_by_file[relpath][0][0].id if relpath in edits_by_file else "?"
            raise PatchError(
                f"patch {owner}: file {relpath} not found in {engine.package_dir} "
                f"({engine.engine} {engine.version}); nothing was written"
            ) from None
        _refuse_marked(engine, relpath, originals[relpath], manifest)
    wanted: dict[str, bytes] = {}
    patch_ids: dict[str, list[str]] = {}
    for relpath, original in originals.items():
        ids: list[str] = []
        text = ""
        edits = edits_by_file.get(relpath, [])
        for index, (patch, edit) in enumerate(edits):
            if not ids:
                text = _decode(patch, relpath, original, engine)
            # libcst: only when a file is rewritten
            from toolkit.guard import backup_relative_to, guard_module
            from toolkit.transform import transform_or_raise

            finish = None
            if index == len(edits) - 1:  # last: guard the runtime imports (a patched engine without us starts)
                backup = backup_relative_to(_engine_file(engine, relpath), state.backup_path(relpath))
                finish = functools.partial(guard_module, engine=engine.engine, backup=backup)
            text = transform_or_raise(patch, edit, text, engine.version, finish).after
            ids.append(patch.id)
        wanted[relpath] = text.encode("utf-8") if ids else original
        patch_ids[relpath] = ids
    return originals, wanted, patch_ids


def _already_done(engine: InstalledEngine, manifest: Manifest | None, target_ids: list[str]) -> bool:
    """Nothing to do, decided from hashes alone (no codemod runs, so the lock is held for milliseconds)."""
    if manifest is None:
        return not target_ids
    if manifest.state != "applied" or manifest.patches != target_ids:
        return False
    known = [p for p in registry() if p.engine == engine.engine and p.id in set(target_ids)]
    if len(known) != len(target_ids):
        return False  # a patch this toolkit does not know: the full path says so in a sentence
    edited = {edit.relpath for p in known for edit in p.files}
    if not edited <= set(manifest.files):
        return False
    return all(sha256_file(_engine_file(engine, r)) == rec.after for r, rec in manifest.files.items())


# --------------------------------------------------------------------------------------------------
# the one write path


# Called after each engine file is replaced; the fault tests use it to fail or stop mid-way.
_after_file_write: Callable[[str], None] | None = None


def reconcile(
    engine: InstalledEngine,
    *,
    add: Sequence[str] = (),
    remove: Sequence[str] | None = (),
    force: bool = False,
    dry_run: bool = False,
    allow_unknown_version: bool = False,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> Result:
    """Apply ``add`` and revert ``remove`` (None: every applied patch) on ``engine``; the applied set
    is read under the lock, so concurrent runs compose. Nothing is written unless every file
    transforms, and a failed write puts back every file it had replaced."""
    _check_versions(engine, patches_for(engine.engine, list(add)) if add else [], allow_unknown_version)
    state = StateDir(engine.site_dir, engine.engine)
    try:
        if dry_run:  # a dry run writes nothing at all, not even the lock file
            return _reconcile_locked(engine, state, add, remove, force, True)
        with state.lock(lock_timeout):
            return _reconcile_locked(engine, state, add, remove, force, False)
    except OSError as exc:
        raise io_error(exc, "cannot read") from None


def _reconcile_locked(
    engine: InstalledEngine, state: StateDir, add: Sequence[str], remove: Sequence[str] | None,
    force: bool, dry_run: bool,
) -> Result:
    old_raw = state.read_manifest_bytes()
    manifest = state.parse_manifest(old_raw) if old_raw is not None else None
    if not dry_run and not (manifest is not None and _stale_manifest(engine, manifest)):
        _sweep_temps(engine, state, manifest)
    plan = make_plan(engine, state, old_raw, manifest, add, remove, force)
    if not dry_run:
        carry_out(state, plan)
    return Result(engine, plan.target_ids, plan.changes, dry_run)


@dataclass
class Write:
    """The journaled write of a plan: backups, files, journal, renames, final manifest (``_write``)."""

    old_raw: bytes | None
    journal: Manifest
    final: Manifest | None
    new_backups: dict[str, bytes]
    package_dir: Path | None = None  # where the files the new backups back are


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
    engine: InstalledEngine, state: StateDir, old_raw: bytes | None, manifest: Manifest | None,
    add: Sequence[str], remove: Sequence[str] | None, force: bool,
) -> Plan:
    """The plan for applying ``add`` and reverting ``remove`` (None: all); raises on drift."""
    reverting = remove is None or bool(remove)
    if manifest is not None and _stale_manifest(engine, manifest):
        if not (reverting and force):
            raise DriftError(
                f"{engine.engine} was reinstalled ({manifest.distribution} {manifest.engine_version} "
                f"was patched, {engine.distribution} {engine.version} is installed now); run "
                "`toolkit revert --force` to forget the old patch state",
                sorted(manifest.files),
            )
        return Plan([], clear_state="stale")  # the backups belong to another install: never restore them here

    applied_before = list(manifest.patches) if manifest else []
    if remove is None:
        target_ids: list[str] = []
    else:
        target_ids = _registry_order(engine.engine, (set(applied_before) | set(add)) - set(remove))
    if manifest is None:
        _refuse_unrecorded_marks(engine, reverting)
    if not force and _already_done(engine, manifest, target_ids):
        return Plan(target_ids, clear_state="orphans" if manifest is None else "", package_dir=engine.package_dir)
    if manifest is not None and target_ids:
        _refuse_foreign(engine, target_ids, manifest.toolkit_version)
    target = patches_for(engine.engine, target_ids) if target_ids else []

    # Which files to look at: those of the patches that change, or every one when a run was
    # interrupted or nothing changes (a rerun that finishes or re-checks the job).
    changing = set(target_ids) ^ set(applied_before)
    every_file = {e.relpath for p in target for e in p.files} | set(manifest.files if manifest else ())
    if manifest is None or manifest.state != "applied" or not changing:
        scope = every_file
    else:
        scope = {e.relpath for p in registry() if p.engine == engine.engine and p.id in changing for e in p.files}
        scope = (scope | {r for r, rec in manifest.files.items() if set(rec.patches) & changing}) & every_file
    originals, wanted, patch_ids = _wanted_contents(engine, state, manifest, target, scope)

    current_sha = {relpath: sha256_file(_engine_file(engine, relpath)) for relpath in wanted}
    _refuse_drift(engine, manifest, originals, current_sha, force, reverting)

    changes = []
    for relpath, data in sorted(wanted.items()):
        if current_sha[relpath] != sha256_bytes(data):
            path = _engine_file(engine, relpath)
            current = _read_or_none(path)
            mode = fs.file_mode(path) if current is not None else None
            changes.append(FileChange(relpath, path, current, data, FILE_MODE if mode is None else mode))

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
                       _registry_order(engine.engine, set(target_ids) | set(applied_before)), dict(final_files))
    for relpath in scope:
        old = manifest.files.get(relpath) if manifest else None
        after = sha256_bytes(wanted[relpath])
        prior = sorted(({old.after, *old.prior} if old else set()) - {after})
        journal.files[relpath] = FileRecord(sha256_bytes(originals[relpath]), after, patch_ids[relpath], prior)
    new_backups = {r: originals[r] for r in scope if patch_ids[r] and not (manifest and r in manifest.files)}
    return Plan(target_ids, changes, Write(old_raw, journal, final, new_backups, Path(engine.package_dir)))


def _refuse_unrecorded_marks(engine: InstalledEngine, reverting: bool) -> None:
    """Patched files with no manifest: their originals are known only to the backups, which are
    never dropped (or trusted) without one. Say so and stop, whatever was asked."""
    ours = {p.id for p in registry() if p.engine == engine.engine}
    marked: dict[str, set[str]] = {}
    for relpath in sorted({e.relpath for p in registry() if p.engine == engine.engine for e in p.files}):
        try:
            found = markers_in(fs.read_bytes(_engine_file(engine, relpath))) & ours
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
    drifted = []
    for relpath, current in current_sha.items():
        record = manifest.files.get(relpath) if manifest else None
        if record is not None and _file_state(current, record) in ("drifted", "missing"):
            drifted.append(relpath)
        elif record is None and current != sha256_bytes(originals[relpath]):
            drifted.append(relpath)  # cannot happen for a file read just now, unless racing
    if drifted and not force:
        verb = "revert" if reverting else "apply-patch"
        raise DriftError(
            f"{engine.engine} {engine.version}: changed since patched (left alone; `toolkit {verb} --force` "
            f"overwrites them): {', '.join(sorted(drifted))}",
            sorted(drifted),
        )


def carry_out(state: StateDir, plan: Plan) -> None:
    """Do what ``plan`` says, all or nothing (see :func:`_write`)."""
    if plan.clear_state == "stale":
        state.clear()
    elif plan.clear_state == "orphans":
        with contextlib.suppress(OSError, PatchError):
            _clear_orphans(state, Path(plan.package_dir))
    if plan.write is not None:
        write = plan.write
        _write(state, write.old_raw, write.journal, write.final, plan.changes, write.new_backups, write.package_dir)


def _clear_orphans(state: StateDir, package_dir: Path) -> None:
    """Backups no manifest owns: each goes only when the file it backs holds its bytes (the release's),
    so a backup that may be the only copy of an original is never lost."""
    if not fs.is_dir(state.backup_root):
        return
    state.refuse_links(state.backup_root)
    for path in sorted(state.backup_root.rglob("*")):
        relpath = str(path.relative_to(state.backup_root))
        if fs.is_dir(path) or relpath.endswith(fs.TEMP_SUFFIX):
            continue
        if _read_or_none(package_dir / relpath) == _read_or_none(path):
            state.remove_backup(relpath)
    for directory in sorted((p for p in state.backup_root.rglob("*") if fs.is_dir(p)), reverse=True):
        with contextlib.suppress(OSError):
            fs.rmdir(directory)  # only the empty ones
    with contextlib.suppress(OSError):
        fs.rmdir(state.backup_root)


def _same_manifest(manifest: Manifest | None, final: Manifest | None) -> bool:
    if manifest is None or final is None:
        return manifest is final
    final.updated_at = manifest.updated_at
    return manifest.to_json() == final.to_json()


def _sweep_temps(engine: InstalledEngine, state: StateDir, manifest: Manifest | None) -> None:
    """Temp files a killed run staged but never renamed: they hold no truth, delete them."""
    relpaths = {e.relpath for p in registry() if p.engine == engine.engine for e in p.files}
    relpaths |= set(manifest.files if manifest else ())
    directories = {_engine_file(engine, r).parent for r in relpaths} | {state.backup_path(r).parent for r in relpaths}
    for directory in sorted(directories | {state.root}):
        with contextlib.suppress(OSError):
            fs.remove_stale_temps(directory)


def _write(
    state: StateDir, old_raw: bytes | None, journal: Manifest, final: Manifest | None,
    changes: list[FileChange], new_backups: dict[str, bytes], package_dir: Path | None = None,
) -> None:
    """All or nothing: backups, then every new file staged and fsync'd, then the journal, then one
    rename per file, then the final manifest (the commit). A failure or a signal before the commit puts
    back every file and the manifest as they were. Signals are held for the whole write (Ctrl-C stops it
    only at a safe point), and the undo looks at each file's bytes, not at a list a signal could cut short."""
    staged: dict[str, str] = {}
    backups_written: list[str] = []
    journal_written = False
    step: tuple[str, Path] = ("write", state.root)  # what was being done, for the message
    with interrupts.held() as signals:
        try:
            for relpath, data in sorted(new_backups.items()):
                step = ("back up the original in", state.backup_path(relpath))
                backups_written.append(relpath)  # before: a backup may exist the moment it is written
                state.write_backup(relpath, data)
                signals.check()
            for change in changes:
                step = ("stage the new", change.path)
                staged[change.relpath] = fs.stage(change.path, change.wanted, change.mode)
                signals.check()
            step = ("write the manifest", state.manifest_path)
            state.write_manifest(journal)
            journal_written = True
            for change in changes:
                signals.check()
                step = ("replace", change.path)
                fs.replace(staged[change.relpath], change.path)
                del staged[change.relpath]
                step = ("remove the stale bytecode of", change.path)
                remove_stale_bytecode(change.path)
                if _after_file_write is not None:
                    _after_file_write(change.relpath)
            for directory in sorted({change.path.parent for change in changes}):
                fs.sync_dir(directory)
            signals.check()
            step = ("write the manifest", state.manifest_path)
            if final is None:
                state.remove_manifest()
            else:
                state.write_manifest(final)
        except BaseException as exc:
            rollback_error = _roll_back(state, old_raw, staged, changes, journal_written, backups_written,
                                        new_backups, package_dir)
            if isinstance(exc, OSError):
                raise _write_error(exc, step, rollback_error) from None
            raise
        # committed; what follows is tidying that no failure can make untrue
        with contextlib.suppress(OSError, PatchError):
            if final is None:
                state.clear()
            else:
                for relpath in set(journal.files) - set(final.files):
                    state.remove_backup(relpath)


def _roll_back(
    state: StateDir, old_raw: bytes | None, staged: dict[str, str], changes: list[FileChange],
    journal_written: bool, backups_written: list[str], new_backups: dict[str, bytes], package_dir: Path | None,
) -> BaseException | None:
    """Undo a failed write; returns the error that stopped the undo (the journal then stays, so that
    `status` says partial and the next run finishes the job), or None when all was put back.

    Each file's bytes decide: one that no longer holds what it held before is written back, whether or
    not its rename was seen to finish. A new backup goes only once the file it backs holds its bytes."""
    for tmp_name in staged.values():
        with contextlib.suppress(OSError):
            fs.unlink(tmp_name)
    try:
        for change in reversed(changes):
            now = _read_or_none(change.path)
            if now == change.current:
                continue
            if change.current is None:
                with contextlib.suppress(FileNotFoundError):
                    fs.unlink(change.path)
            else:
                fs.atomic_write(change.path, change.current, change.mode)
        if journal_written:
            state.restore_manifest(old_raw)
    except (OSError, PatchError) as exc:
        return exc
    for relpath in backups_written:
        with contextlib.suppress(OSError):
            if package_dir is not None and _read_or_none(package_dir / relpath) == new_backups[relpath]:
                state.remove_backup(relpath)
    return None


def _write_error(exc: OSError, step: tuple[str, Path], rollback_error: BaseException | None) -> PatchError:
    verb, path = step
    named = str(exc.filename or "")  # a temp file's name means nothing to the user: name the file it stands for
    what = io_error(exc, f"cannot {verb}", named if named and not named.endswith(fs.TEMP_SUFFIX) else path)
    if rollback_error is None:
        return PatchError(f"{what}; every file was put back as it was, nothing changed")
    undo = io_error(rollback_error, "at", rollback_error.filename) if isinstance(rollback_error, OSError) \
        else rollback_error
    return PatchError(
        f"{what}; putting the files back failed too ({undo}); each file is whole (original or patched) and the "
        "manifest records the run: `toolkit apply-patch` or `toolkit revert` finishes it once the disk is writable"
    )


def _refuse_foreign(engine: InstalledEngine, applied: Sequence[str], by_version: str) -> None:
    """A patch applied by another toolkit (or one since removed from this one) can be neither kept nor
    re-derived here; dropping it silently would revert it behind the user's back."""
    known = {p.id for p in registry() if p.engine == engine.engine}
    foreign = [pid for pid in applied if pid not in known]
    if foreign:
        raise PatchError(
            f"{engine.engine} {engine.version} has patches applied that this toolkit {__version__} does "
            f"not know: {', '.join(foreign)} (applied by toolkit {by_version}); run `toolkit revert` "
            "first, which restores the originals"
        )


def _read_or_none(path: Path) -> bytes | None:
    try:
        return fs.read_bytes(path)
    except FileNotFoundError:
        return None


# --------------------------------------------------------------------------------------------------
# the verbs


def applied_ids(engine: InstalledEngine) -> list[str]:
    manifest = StateDir(engine.site_dir, engine.engine).read_manifest()
    if manifest is None or _stale_manifest(engine, manifest):
        return []
    return list(manifest.patches)


def apply(
    engine: InstalledEngine,
    patch_ids: Sequence[str] | None = None,
    *,
    force: bool = False,
    dry_run: bool = False,
    allow_unknown_version: bool = False,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> Result:
    """Apply ``patch_ids`` (None: every patch for this engine version) on top of what is applied."""
    if patch_ids is not None and not patch_ids:
        raise UsageError(f"no patch of {engine.engine} named")
    candidates = patches_for(engine.engine, patch_ids)
    if patch_ids is None:
        candidates = [p for p in candidates if not p.not_needed_on(engine.version)
                      and (allow_unknown_version or p.supports(engine.version))]
    if not candidates:
        raise PatchError(f"no patch supports {engine.distribution} {engine.version} "
                         f"(see `toolkit list`; --allow-unknown-version, allow_unknown_version=True in Python, "
                         "tries anyway)")
    _require_runtime(engine, candidates)
    return reconcile(engine, add=[p.id for p in candidates], force=force, dry_run=dry_run,
                     allow_unknown_version=allow_unknown_version, lock_timeout=lock_timeout)


def _require_runtime(engine: InstalledEngine, patches: Sequence[Patch]) -> None:
    """A patch whose edits import its runtime module needs this project, at this version, importable by
    the engine's interpreter: otherwise the patched engine would not start. Checked before anything is
    written (``--python`` into another environment)."""
    needed = [p.id for p in patches if p.runtime_modules]
    if not needed or engine.toolkit_version is None or engine.toolkit_version == __version__:
        return
    found = f"serving-toolkit {engine.toolkit_version}" if engine.toolkit_version else "no serving-toolkit"
    raise PatchError(
        f"{engine.python} has {found}, but the patched {engine.engine} would import this project's runtime "
        f"modules ({', '.join(needed)}) at start-up; install it there first "
        f"(`{engine.python} -m pip install 'serving-toolkit=={__version__}'`); nothing was written")


def revert(
    engine: InstalledEngine,
    patch_ids: Sequence[str] | None = None,
    *,
    force: bool = False,
    dry_run: bool = False,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> Result:
    """Revert ``patch_ids`` (None: all); the others stay applied. Originals come back byte-for-byte;
    with ``force``, only the files of the reverted patches are overwritten."""
    if patch_ids is not None:
        if not patch_ids:
            raise UsageError(f"no patch of {engine.engine} named")
        patches_for(engine.engine, patch_ids)  # unknown ids are a usage error
    return reconcile(engine, remove=None if patch_ids is None else list(patch_ids), force=force, dry_run=dry_run,
                     lock_timeout=lock_timeout)


def status(engine: InstalledEngine) -> list[PatchState]:
    """Hash-only state of every patch for ``engine``: no parsing of sources, no lock taken.

    Without a readable manifest, the files speak for themselves: a patch whose files carry its
    marker is reported as ``patched, no manifest``."""
    state_dir = StateDir(engine.site_dir, engine.engine)
    holder = state_dir.holder()
    problem = ""
    try:
        manifest = state_dir.read_manifest()
    except CorruptManifest as exc:
        manifest, problem = None, str(exc)
    stale = manifest is not None and _stale_manifest(engine, manifest)
    rows = []
    for patch in patches_for(engine.engine):
        files: dict[str, str] = {}
        detail = ""
        if manifest is None:
            state, detail, files = _state_from_markers(engine, patch, problem)
        elif patch.id not in manifest.patches:
            state = NOT_APPLIED
        elif stale:
            state = DRIFTED
            detail = f"patched as {manifest.distribution} {manifest.engine_version}; engine reinstalled since"
        else:
            for edit in patch.files:
                record = manifest.files.get(edit.relpath)
                current = sha256_file(_engine_file(engine, edit.relpath))
                files[edit.relpath] = _file_state(current, record) if record else "unrecorded"
            values = set(files.values())
            if manifest.state == "applied" and values == {"patched"}:
                state = APPLIED
            elif manifest.state == "applied" and values == {"original"}:
                state = DRIFTED
                detail = ("its files are the release's originals again (engine reinstalled?); `toolkit apply-patch` "
                          "patches them again, `toolkit revert` forgets the state")
            elif manifest.state == "applied" or values & {"drifted", "missing", "unrecorded"}:
                state = DRIFTED
                detail = "changed since patched: " + ", ".join(r for r, s in files.items() if s != "patched")
            else:
                state = PARTIAL
                verb = "an apply" if manifest.state == "applying" else "a revert"
                detail = f"{verb} was interrupted; run apply-patch or revert to finish"
        if manifest is not None and not stale and state in (APPLIED, PARTIAL):
            lost = _unusable_backups(state_dir, manifest, [e.relpath for e in patch.files])
            if lost:
                state = DRIFTED
                detail = f"the backup of {', '.join(lost)} is missing or altered, so revert cannot restore it; {RECOVER}"
        if holder is not None and state not in (APPLIED, NOT_APPLIED):
            state, detail = IN_PROGRESS, f"in progress (pid {holder})"
        if state == APPLIED and patch.runtime_modules and engine.toolkit_version not in (None, __version__):
            state = RUNTIME_MISSING
            fix = (f"`{engine.python} -m pip install 'serving-toolkit=={__version__}'` there, or "
                   f"`toolkit revert {engine.engine} --python {engine.python}`")
            if engine.toolkit_version:
                detail = (f"{engine.python} has serving-toolkit {engine.toolkit_version}, but the patched files were "
                          f"written for {__version__}'s runtime; {fix}")
            else:
                detail = (f"{engine.python} has no serving-toolkit importable: the patched files run as the release "
                          f"wrote them (the patches are off, with a warning at start-up); {fix}")
        rows.append(
            PatchState(engine.engine, engine.distribution, engine.version, patch.id, state,
                       patch.supports(engine.version), files, detail)
        )
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


def _state_from_markers(engine: InstalledEngine, patch: Patch, problem: str) -> tuple[PatchStateName, str, dict[str, str]]:
    files = {}
    for edit in patch.files:
        try:
            data = fs.read_bytes(_engine_file(engine, edit.relpath))
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


@dataclass
class AnchorCheck:
    patch_id: str
    relpath: str
    transformer: str
    anchor: str
    description: str
    found: int
    ok: bool
    problem: str


@dataclass
class SourceCheck:
    source: SourceTree
    patch_id: str
    supported: bool
    anchors: list[AnchorCheck]
    errors: list[str]

    @property
    def ok(self) -> bool:
        return not self.errors and all(a.ok for a in self.anchors)


def check_source(source: SourceTree, patch_ids: Sequence[str] | None = None) -> list[SourceCheck]:
    """Per patch and per anchor: would it apply to this source tree?

    By default the patches that declare the tree's version (what ``apply-patch`` would apply); when
    none does (porting to a new version), every patch for the engine. Named patches are always checked.
    """
    from toolkit.transform import run_transformers  # libcst

    results = []
    candidates = patches_for(source.engine, patch_ids)
    if not patch_ids and any(p.supports(source.version) for p in candidates):
        candidates = [p for p in candidates if p.supports(source.version)]
    for patch in candidates:
        anchors: list[AnchorCheck] = []
        errors: list[str] = []
        for edit in patch.files:
            data = source.read(edit.relpath)
            if data is None:
                errors.append(f"{edit.relpath}: file not found")
                continue
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                errors.append(f"{edit.relpath}: not UTF-8 text ({exc})")
                continue
            try:
                outcome = run_transformers(patch, edit, text, source.version)
            except PatchError as exc:
                errors.append(str(exc))
                continue
            for transformer_name, anchor in outcome.anchors:
                anchors.append(AnchorCheck(patch.id, edit.relpath, transformer_name, anchor.name,
                                           anchor.description, anchor.count, anchor.ok, anchor.problem))
            if outcome.ok:
                try:
                    compile(outcome.after, edit.relpath, "exec")
                except SyntaxError as exc:
                    errors.append(f"{edit.relpath}: patched result does not compile: {exc}")
        results.append(SourceCheck(source, patch.id, patch.supports(source.version), anchors, errors))
    return results
