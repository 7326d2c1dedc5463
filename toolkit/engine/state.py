"""On-disk state of the patches applied to one engine install: manifest, backups, lock.

Layout, beside the engine's package in its site-packages::

    .toolkit-state/<engine>/manifest.json   what is applied, each file's sha256 before and after
    .toolkit-state/<engine>/backups/<relpath>  the original bytes of every edited file
    .toolkit-state/<engine>/lock             held while an apply or revert runs

Every write is atomic (temp file in the same directory, fsync, rename), so a crash at any point
leaves each file either as it was or as it should be; the manifest's ``state`` says which phase
was running, and the next apply or revert finishes the job. Directories are 0755 and files 0644
whatever the umask, and nothing under ``.toolkit-state`` may be a symbolic link (it could lead the
backups out of site-packages).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from toolkit.base.cache_files import FILE_MODE
from toolkit.engine import fs
from toolkit.engine.bytecode_prefix import remove_in, remove_under_prefix
from toolkit.engine.discovery import STATE_DIRNAME
from toolkit.errors import CorruptManifest, LockTimeout, PatchError, io_error

MANIFEST_FORMAT = 1
DIR_MODE = 0o755
MANIFEST_STATES = ("applying", "applied", "reverting")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str | None:
    try:
        return sha256_bytes(fs.read_bytes(path))
    except (FileNotFoundError, NotADirectoryError):
        return None


def remove_stale_bytecode(source: Path) -> None:
    """Delete every cached bytecode of ``source`` so that no process runs the old code from cache: in
    ``__pycache__``, ``<stem>.<tag>.pyc`` for any interpreter tag and ``<stem>.<tag>.opt-N.pyc`` for any
    optimisation level (an unchecked-hash one is trusted without a look at the source), and a legacy
    ``<stem>.pyc`` beside it; and under ``PYTHONPYCACHEPREFIX`` (``sys.pycache_prefix`` of this process)
    the same names in the prefix's mirror of the source's folder, where such a process writes them."""
    remove_under_prefix(source, is_bytecode_of)
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        fs.unlink(source.with_suffix(".pyc"))
    remove_in(source.parent / "__pycache__", source.stem, is_bytecode_of)


def is_bytecode_of(stem: str, name: str) -> bool:
    """Whether ``__pycache__/<name>`` caches the module ``<stem>.py`` (``importlib.util.cache_from_source``'s
    names: ``<stem>.<tag>.pyc`` or ``<stem>.<tag>.opt-<level>.pyc``)."""
    if not (name.startswith(f"{stem}.") and name.endswith(".pyc")):
        return False
    parts = name[len(stem) + 1:-len(".pyc")].split(".")
    return bool(parts[0]) and (len(parts) == 1 or (len(parts) == 2 and parts[1].startswith("opt-")))


@dataclass
class FileRecord:
    before: str  # sha256 of the original file
    after: str  # sha256 of the file with every applied patch
    patches: list[str]
    # sha256 values a file may still have while an apply or revert is running (the previous "after");
    # a file with one of them is mid-way, not drifted.
    prior: list[str] = field(default_factory=list)


@dataclass
class Manifest:
    toolkit_version: str
    engine: str
    distribution: str
    engine_version: str
    state: str  # "applying", "applied" or "reverting"
    patches: list[str]
    files: dict[str, FileRecord]
    updated_at: float = 0.0

    def to_json(self) -> str:
        data = {
            "format": MANIFEST_FORMAT,
            "toolkit_version": self.toolkit_version,
            "engine": self.engine,
            "distribution": self.distribution,
            "engine_version": self.engine_version,
            "state": self.state,
            "patches": self.patches,
            "files": {
                relpath: {
                    "before": rec.before,
                    "after": rec.after,
                    "patches": rec.patches,
                    **({"prior": rec.prior} if rec.prior else {}),
                }
                for relpath, rec in sorted(self.files.items())
            },
            "updated_at": self.updated_at,
        }
        return json.dumps(data, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        """Parse and check every field's type; anything else is a ``ValueError`` saying what is wrong."""
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError(f"expected an object, found {type(data).__name__}")
        if data.get("format") != MANIFEST_FORMAT:
            raise ValueError(f"unsupported manifest format {data.get('format')!r}")
        for key in ("toolkit_version", "engine", "distribution", "engine_version", "state"):
            _expect(data, key, str)
        if data["state"] not in MANIFEST_STATES:
            raise ValueError(f"unknown state {data['state']!r}")
        patches = _string_list(data.get("patches"), "patches")
        files = _expect(data, "files", dict)
        records = {}
        for relpath, rec in files.items():
            if not isinstance(rec, dict) or not _safe_relpath(relpath):
                raise ValueError(f"bad file entry {relpath!r}")
            records[relpath] = FileRecord(
                _expect(rec, "before", str), _expect(rec, "after", str),
                _string_list(rec.get("patches"), f"{relpath}: patches"),
                _string_list(rec.get("prior", []), f"{relpath}: prior"),
            )
        return cls(data["toolkit_version"], data["engine"], data["distribution"], data["engine_version"],
                   data["state"], patches, records, _timestamp(data.get("updated_at")))


def _timestamp(value: Any) -> float:
    """``updated_at`` is for people, not for decisions: anything but a finite number reads as 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        return 0.0
    return number if math.isfinite(number) else 0.0


def _expect(data: dict[str, Any], key: str, kind: type) -> Any:
    value = data.get(key)
    if not isinstance(value, kind):
        raise ValueError(f"{key!r} should be a {kind.__name__}, found {type(value).__name__}")
    return value


def _string_list(value: Any, what: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ValueError(f"{what!r} should be a list of strings")
    return list(value)


def _safe_relpath(relpath: str) -> bool:
    """A manifest names files inside the engine package only (a crafted '../x' must not escape it)."""
    parts = Path(relpath).parts
    return bool(parts) and not Path(relpath).is_absolute() and ".." not in parts


class StateDir:
    """The state directory of one engine install."""

    def __init__(self, site_dir: Path, engine: str) -> None:
        self.site_dir = Path(site_dir)
        self.root = self.site_dir / STATE_DIRNAME / engine
        self.manifest_path = self.root / "manifest.json"
        self.backup_root = self.root / "backups"
        self.lock_path = self.root / "lock"

    # ---- guarding the paths

    def refuse_links(self, path: Path) -> None:
        """Refuse a symbolic link anywhere from ``.toolkit-state`` down to ``path``."""
        link = fs.first_link(self.site_dir, path)
        if link is not None:
            raise PatchError(
                f"{link} is a symbolic link; toolkit keeps its state only inside {self.site_dir} and "
                "does not follow links out of it (remove the link and run the command again)"
            )

    def make_dirs(self, directory: Path) -> None:
        """Create ``directory`` and its missing parents under site-packages, each 0755."""
        self.refuse_links(directory)
        missing = []
        current = directory
        while current != self.site_dir and not fs.is_dir(current):
            missing.append(current)
            current = current.parent
        for path in reversed(missing):
            with contextlib.suppress(FileExistsError):
                fs.mkdir(path, DIR_MODE)

    def exists(self) -> bool:
        return fs.is_dir(self.root)

    # ---- manifest

    def read_manifest_bytes(self) -> bytes | None:
        self.refuse_links(self.manifest_path)
        try:
            return fs.read_bytes(self.manifest_path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise io_error(exc, "cannot read the toolkit manifest") from None

    def read_manifest(self) -> Manifest | None:
        raw = self.read_manifest_bytes()
        return None if raw is None else self.parse_manifest(raw)

    def parse_manifest(self, raw: bytes) -> Manifest:
        try:
            return Manifest.from_json(raw.decode("utf-8"))
        except (ValueError, TypeError, RecursionError, OverflowError) as exc:
            raise CorruptManifest(
                f"the toolkit manifest {self.manifest_path} is unreadable ({_one_line(exc)}); "
                "`toolkit repair` puts the engine's release files back and clears the state"
            ) from None

    def write_manifest(self, manifest: Manifest) -> None:
        manifest.updated_at = time.time()
        self.write_manifest_bytes(manifest.to_json().encode())

    def write_manifest_bytes(self, raw: bytes) -> None:
        self.make_dirs(self.root)
        self.refuse_links(self.manifest_path)
        fs.atomic_write(self.manifest_path, raw, FILE_MODE)

    def restore_manifest(self, raw: bytes | None) -> None:
        """Put back the manifest read before a run (``None``: there was none)."""
        if raw is None:
            self.remove_manifest()
        else:
            self.write_manifest_bytes(raw)

    def remove_manifest(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            fs.unlink(self.manifest_path)

    # ---- backups

    def backup_path(self, relpath: str) -> Path:
        return self.backup_root / relpath

    def read_backup(self, relpath: str, expected_sha: str) -> bytes:
        path = self.backup_path(relpath)
        data = self.read_backup_or_none(relpath)
        if data is None:
            raise PatchError(f"the backup of {relpath} is missing ({path}); {RECOVER}")
        if sha256_bytes(data) != expected_sha:
            raise PatchError(f"the backup of {relpath} does not match the manifest ({path}); {RECOVER}")
        return data

    def read_backup_or_none(self, relpath: str) -> bytes | None:
        path = self.backup_path(relpath)
        self.refuse_links(path)
        try:
            return fs.read_bytes(path)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def write_backup(self, relpath: str, data: bytes, mode: int = FILE_MODE) -> None:
        """The backup of ``relpath``, with ``mode`` (its file's, never more open than 0644)."""
        path = self.backup_path(relpath)
        self.make_dirs(path.parent)
        self.refuse_links(path)
        fs.atomic_write(path, data, mode & FILE_MODE)

    def backup_relpaths(self) -> list[str]:
        """The files under ``backups/`` (a run's temp files aside), as paths inside the engine package."""
        self.refuse_links(self.backup_root)
        if not fs.is_dir(self.backup_root):
            return []
        return sorted(str(path.relative_to(self.backup_root)) for path in self.backup_root.rglob("*")
                      if path.is_file() and not path.name.endswith(fs.TEMP_SUFFIX))

    def remove_backup(self, relpath: str) -> None:
        """Remove one backup, then its folders up to ``backups/`` as they become empty."""
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            fs.unlink(self.backup_path(relpath))
        folder = self.backup_path(relpath).parent
        while self.backup_root in (folder, *folder.parents):
            try:
                fs.rmdir(folder)
            except OSError:  # not empty (or gone): the folders above are not empty either
                return
            folder = folder.parent

    def clear(self) -> None:
        """Remove manifest and backups once nothing is applied (the manifest first: it is the truth)."""
        self.refuse_links(self.backup_root)
        self.remove_manifest()
        fs.remove_tree(self.backup_root)

    def remove_all(self) -> None:
        """Remove the whole state directory (an engine that is gone leaves nothing to lock against)."""
        self.refuse_links(self.root)
        fs.remove_tree(self.root)
        with contextlib.suppress(OSError):
            fs.rmdir(self.root.parent)  # only when no other engine's state is left in it

    # ---- lock

    @contextlib.contextmanager
    def lock(self, timeout: float) -> Iterator[None]:
        """Hold an exclusive lock; wait up to ``timeout`` seconds for another run to finish.
        Only the holder writes its pid into the lock file; a waiter never touches it."""
        try:
            self.make_dirs(self.root)
            self.refuse_links(self.lock_path)
            fd = fs.open_fd(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, FILE_MODE)
        except OSError as exc:
            raise io_error(exc, "cannot create the toolkit lock") from None
        acquired = False
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fs.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno != errno.EWOULDBLOCK:  # flock says "held" with EWOULDBLOCK only
                        raise io_error(exc, "cannot lock", self.lock_path) from None
                    if time.monotonic() >= deadline:
                        raise LockTimeout(
                            f"another toolkit run (pid {self._holder_pid(fd)}) holds {self.lock_path}; "
                            f"waited {timeout:g}s. Try again when it has finished."
                        ) from None
                    time.sleep(0.05)
            acquired = True
            with contextlib.suppress(OSError):
                fs.fchmod(fd, FILE_MODE)  # the umask may have masked the mode it was created with
                fs.overwrite(fd, str(os.getpid()).encode())
            yield
        finally:
            if acquired:
                with contextlib.suppress(OSError):
                    fs.overwrite(fd, b"")
            with contextlib.suppress(OSError):
                fs.close(fd)  # closing the descriptor releases the flock

    def holder(self) -> str | None:
        """The pid of the run holding the lock now, or None; takes no lock and creates nothing."""
        try:
            self.refuse_links(self.lock_path)
            fd = fs.open_fd(self.lock_path, os.O_RDONLY | os.O_NOFOLLOW)
        except (OSError, PatchError):
            return None
        try:
            try:
                fs.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError as exc:
                return self._holder_pid(fd) if exc.errno == errno.EWOULDBLOCK else None
            with contextlib.suppress(OSError):
                fs.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            with contextlib.suppress(OSError):
                fs.close(fd)

    @staticmethod
    def _holder_pid(fd: int) -> str:
        with contextlib.suppress(OSError):
            return fs.pread(fd, 64).decode(errors="replace").strip() or "unknown"
        return "unknown"


RECOVER = "`toolkit repair` puts the engine's release files back (checked against pip's RECORD) and clears the state"


def _one_line(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
