"""On-disk state of the patches applied to one engine install: manifest, backups, lock.

Layout, beside the engine's package in its site-packages::

    .toolkit-state/<engine>/manifest.json   what is applied, each file's sha256 before and after
    .toolkit-state/<engine>/backups/<relpath>  the original bytes of every edited file
    .toolkit-state/<engine>/lock             held while an apply or revert runs

Every write is atomic (temp file in the same directory, fsync, rename), so a crash at any point
leaves each file either as it was or as it should be; the manifest's ``state`` says which phase
was running, and the next apply or revert finishes the job.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from toolkit.errors import LockTimeout, PatchError

MANIFEST_FORMAT = 1
STATE_DIRNAME = ".toolkit-state"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str | None:
    try:
        return sha256_bytes(path.read_bytes())
    except FileNotFoundError:
        return None


def atomic_write(path: Path, data: bytes, mode: int | None = None) -> None:
    """Replace ``path`` with ``data`` in one rename; keep ``mode`` (default: the current file's)."""
    if mode is None:
        with contextlib.suppress(FileNotFoundError):
            mode = path.stat().st_mode & 0o7777
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".toolkit-tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if mode is not None:
            os.chmod(tmp_name, mode)
        os.replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def remove_stale_bytecode(source: Path) -> None:
    """Delete ``__pycache__/<stem>.*.pyc`` so no process runs the old code from cache."""
    cache_dir = source.parent / "__pycache__"
    if cache_dir.is_dir():
        for pyc in cache_dir.glob(f"{source.stem}.*.pyc"):
            with contextlib.suppress(FileNotFoundError):
                pyc.unlink()


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
        data = json.loads(text)
        if data.get("format") != MANIFEST_FORMAT:
            raise PatchError(f"unsupported manifest format {data.get('format')!r}")
        return cls(
            toolkit_version=data["toolkit_version"],
            engine=data["engine"],
            distribution=data["distribution"],
            engine_version=data["engine_version"],
            state=data["state"],
            patches=list(data["patches"]),
            files={
                relpath: FileRecord(rec["before"], rec["after"], list(rec["patches"]), list(rec.get("prior", [])))
                for relpath, rec in data["files"].items()
            },
            updated_at=data.get("updated_at", 0.0),
        )


class StateDir:
    """The state directory of one engine install."""

    def __init__(self, site_dir: Path, engine: str) -> None:
        self.root = site_dir / STATE_DIRNAME / engine
        self.manifest_path = self.root / "manifest.json"
        self.backup_root = self.root / "backups"
        self.lock_path = self.root / "lock"

    def read_manifest(self) -> Manifest | None:
        try:
            text = self.manifest_path.read_text()
        except FileNotFoundError:
            return None
        try:
            return Manifest.from_json(text)
        except (ValueError, KeyError) as exc:
            raise PatchError(f"corrupt manifest {self.manifest_path}: {exc}") from exc

    def write_manifest(self, manifest: Manifest) -> None:
        manifest.updated_at = time.time()
        atomic_write(self.manifest_path, manifest.to_json().encode(), mode=0o644)

    def backup_path(self, relpath: str) -> Path:
        return self.backup_root / relpath

    def read_backup(self, relpath: str, expected_sha: str) -> bytes:
        path = self.backup_path(relpath)
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise PatchError(f"backup of {relpath} is missing ({path})") from exc
        if sha256_bytes(data) != expected_sha:
            raise PatchError(f"backup of {relpath} does not match the manifest ({path})")
        return data

    def write_backup(self, relpath: str, data: bytes) -> None:
        atomic_write(self.backup_path(relpath), data, mode=0o644)

    def clear(self) -> None:
        """Remove manifest and backups once nothing is applied."""
        import shutil

        with contextlib.suppress(FileNotFoundError):
            self.manifest_path.unlink()
        shutil.rmtree(self.backup_root, ignore_errors=True)

    @contextlib.contextmanager
    def lock(self, timeout: float) -> Iterator[None]:
        """Hold an exclusive lock; wait up to ``timeout`` seconds for another run to finish."""
        self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            deadline = time.monotonic() + timeout
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if time.monotonic() >= deadline:
                        holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                        raise LockTimeout(
                            f"another toolkit run (pid {holder}) holds {self.lock_path}; "
                            f"waited {timeout:g}s. Try again when it has finished."
                        ) from None
                    time.sleep(0.1)
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            os.close(fd)  # closing the descriptor releases the flock
