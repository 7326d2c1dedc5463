"""Every file-system call the patch engine makes, in one place.

``toolkit.engine.patching``, ``toolkit.engine.state`` and ``toolkit.engine.repair`` touch the disk only through these
functions (always as ``fs.name(...)``, never imported by name), so the fault tests can replace any
one of them and fail, or SIGKILL the process at, the k-th call. Each is a thin wrapper: an ``OSError``
raised here carries the path in ``filename``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat as _stat
import tempfile
from pathlib import Path

TEMP_SUFFIX = ".toolkit-tmp"


def read_bytes(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def lstat(path: str | Path) -> os.stat_result:
    return os.lstat(path)


def listdir(path: Path) -> list[str]:
    return os.listdir(path)


def mkdir(path: Path, mode: int) -> None:
    """One directory, with exactly ``mode`` whatever the umask (chmod is not masked); never writable by
    others in between, even under umask 0 (created 0700 at most, then given ``mode``)."""
    os.mkdir(path, 0o700)
    os.chmod(path, mode)


def make_dirs(path: Path, mode: int = 0o755) -> None:
    """``path`` and each missing folder above it, every one created with exactly ``mode`` (``os.makedirs``
    gives the parents 0777 under umask 0: a cache folder others could write into)."""
    missing = []
    while not os.path.lexists(path):
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            mkdir(folder, mode)
        except FileExistsError:  # another process made it meanwhile
            pass


def writable_by_others(path: Path) -> bool:
    """Owned by another user, or group- or world-writable: what such a path holds may be anyone's."""
    info = os.lstat(path)
    return info.st_uid != os.geteuid() or bool(info.st_mode & 0o022)


def chmod(path: Path | str, mode: int) -> None:
    os.chmod(path, mode)


def unlink(path: Path | str) -> None:
    os.unlink(path)


def rmdir(path: Path) -> None:
    os.rmdir(path)


def replace(src: Path | str, dst: Path | str) -> None:
    os.replace(src, dst)


def mkstemp(directory: Path, name: str) -> tuple[int, str]:
    return tempfile.mkstemp(prefix=f".{name}.", suffix=TEMP_SUFFIX, dir=directory)


def write_all(fd: int, data: bytes, path: str) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except OSError as exc:
            exc.filename = exc.filename or path
            raise
        view = view[written:]


def fsync(fd: int, path: str) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        exc.filename = exc.filename or path
        raise


def close(fd: int) -> None:
    os.close(fd)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def open_fd(path: Path, flags: int, mode: int = 0o644) -> int:
    return os.open(path, flags, mode)


def flock(fd: int, operation: int) -> None:
    fcntl.flock(fd, operation)


def pread(fd: int, size: int) -> bytes:
    return os.pread(fd, size, 0)


def overwrite(fd: int, data: bytes) -> None:
    """Make the open file hold exactly ``data`` (the lock file's pid)."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, data, 0)


def fchmod(fd: int, mode: int) -> None:
    os.fchmod(fd, mode)


# --------------------------------------------------------------------------------------------------
# compositions of the calls above (they go through the module attributes, so faults reach them too)


def is_dir(path: Path) -> bool:
    try:
        return _stat.S_ISDIR(lstat(path).st_mode)
    except FileNotFoundError:
        return False


def stage(path: Path, data: bytes, mode: int) -> str:
    """Write ``data`` to a new temp file beside ``path``, fsync'd, with ``mode``; return its name.
    Nothing is visible at ``path`` until :func:`replace`."""
    fd, tmp_name = mkstemp(path.parent, path.name)
    is_open = True
    try:
        write_all(fd, data, tmp_name)
        fsync(fd, tmp_name)
        close(fd)
        is_open = False
        chmod(tmp_name, mode)
    except BaseException:
        if is_open:
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            unlink(tmp_name)
        raise
    return tmp_name


def sync_dir(directory: Path) -> None:
    """Make renames in ``directory`` durable; some file systems cannot fsync a directory."""
    with contextlib.suppress(OSError):
        fsync_dir(directory)


def atomic_write(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data`` in one rename."""
    tmp_name = stage(path, data, mode)
    try:
        replace(tmp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            unlink(tmp_name)
        raise
    sync_dir(path.parent)


def file_mode(path: Path) -> int | None:
    try:
        return lstat(path).st_mode & 0o7777
    except FileNotFoundError:
        return None


def first_link(base: Path | str, path: Path | str) -> str | None:
    """The first symbolic link on the way from ``base`` (itself not looked at) down to ``path`` (itself
    included), or None; the walk stops at the first part that does not exist."""
    # On strings, not pathlib: called for every file an apply or revert touches.
    root, target = os.fspath(base), os.fspath(path)
    if target != root and not target.startswith(root.rstrip(os.sep) + os.sep):
        raise ValueError(f"{target!r} is not under {root!r}")  # as Path.relative_to says it
    current = root
    for part in target[len(root):].split(os.sep):
        if not part:
            continue
        current = os.path.join(current, part)
        try:
            info = lstat(current)
        except FileNotFoundError:
            return None
        if _stat.S_ISLNK(info.st_mode):
            return current
    return None


def remove_tree(path: Path) -> None:
    """``rm -r`` that never follows a symbolic link (a link is removed, not its target)."""
    try:
        info = lstat(path)
    except FileNotFoundError:
        return
    if _stat.S_ISDIR(info.st_mode):
        for name in listdir(path):
            remove_tree(path / name)
        rmdir(path)
    else:
        unlink(path)


def remove_stale_temps(directory: Path) -> None:
    """Delete the temp files an earlier run left behind when it was killed between stage and rename."""
    try:
        names = listdir(directory)
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in names:
        if name.startswith(".") and name.endswith(TEMP_SUFFIX):
            with contextlib.suppress(FileNotFoundError):
                unlink(directory / name)
