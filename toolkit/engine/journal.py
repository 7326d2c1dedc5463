"""The one write path of the patch engine: all or nothing, journaled, Ctrl-C safe.

Backups first, then every new file staged and fsync'd, the journal (the manifest in its "applying" or
"reverting" state), one rename per file, and the final manifest as the commit. Anything before the
commit, an error or a signal, puts every file and the manifest back as they were.
"""

from __future__ import annotations

import contextlib
import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from toolkit.engine import fs, interrupts
from toolkit.errors import PatchError, io_error
from toolkit.base.cache_files import FILE_MODE
from toolkit.engine.state import Manifest, StateDir, remove_stale_bytecode


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


# Called after each engine file is replaced; the fault tests use it to fail or stop mid-way.
_after_file_write: Callable[[str], None] | None = None


def write_all_or_nothing(
    state: StateDir, old_raw: bytes | None, journal: Manifest, final: Manifest | None,
    changes: list[FileChange], new_backups: dict[str, bytes], package_dir: Path | None = None,
    backup_modes: dict[str, int] | None = None,
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
                state.write_backup(relpath, data, (backup_modes or {}).get(relpath, FILE_MODE))
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
            fs.discard_temp(tmp_name)
    try:
        for change in reversed(changes):
            now = read_or_none(change.path)
            if now == change.current:
                continue
            if change.current is None:
                with contextlib.suppress(FileNotFoundError):
                    fs.unlink(change.path)
            else:
                fs.atomic_write(change.path, change.current, change.mode)
            with contextlib.suppress(OSError):  # a cache of the bytes just undone must not outlive them
                remove_stale_bytecode(change.path)
        if journal_written:
            state.restore_manifest(old_raw)
    except (OSError, PatchError) as exc:
        return exc
    for relpath in backups_written:
        with contextlib.suppress(OSError):
            if package_dir is not None and read_or_none(package_dir / relpath) == new_backups[relpath]:
                state.remove_backup(relpath)
    return None


def _write_error(exc: OSError, step: tuple[str, Path], rollback_error: BaseException | None) -> PatchError:
    verb, path = step
    named = str(exc.filename or "")  # a temp file's name means nothing to the user: name the file it stands for
    what: object = io_error(exc, f"cannot {verb}", named if named and not named.endswith(fs.TEMP_SUFFIX) else path)
    if isinstance(exc, fs.LinkInTheWay):
        what = (f"{exc.filename} became a symbolic link while toolkit was writing, and toolkit never writes "
                "through or over a link (replace it by a copy of what it points to and run the command again)")
    if rollback_error is None:
        return PatchError(f"{what}; every file was put back as it was, nothing changed")
    undo: object = rollback_error
    once = "once the disk is writable"
    if isinstance(rollback_error, fs.LinkInTheWay):
        undo, once = f"{rollback_error.filename} is a symbolic link", "once the link is a copy of what it points to"
    elif isinstance(rollback_error, OSError):
        undo = io_error(rollback_error, "at", rollback_error.filename)
    return PatchError(
        f"{what}; putting the files back failed too ({undo}); each file is whole (original or patched) and the "
        f"manifest records the run: `toolkit apply-patch` or `toolkit revert` finishes it {once}"
    )


def clear_orphans(state: StateDir, package_dir: Path) -> None:
    """Backups no manifest owns: each goes only when the file it backs holds its bytes (the release's),
    so a backup that may be the only copy of an original is never lost."""
    if not fs.is_dir(state.backup_root):
        return
    for relpath in state.backup_relpaths():
        if read_or_none(package_dir / relpath) == read_or_none(state.backup_path(relpath)):
            state.remove_backup(relpath)
    for directory in sorted((p for p in state.backup_root.rglob("*") if fs.is_dir(p)), reverse=True):
        with contextlib.suppress(OSError):
            fs.rmdir(directory)  # only the empty ones
    with contextlib.suppress(OSError):
        fs.rmdir(state.backup_root)


def read_or_none(path: Path) -> bytes | None:
    try:
        return fs.read_bytes(path)
    except FileNotFoundError:
        return None
