"""Every file-system call the patch engine makes, in one place.

``toolkit.engine.patching``, ``toolkit.engine.state`` and ``toolkit.engine.repair`` touch the disk only through these
functions (always as ``fs.name(...)``, never imported by name), so the fault tests can replace any
one of them and fail, or SIGKILL the process at, the k-th call. Each is a thin wrapper: an ``OSError``
raised here carries the path in ``filename``.

Inside :func:`confined` (an apply, revert or repair: the engine's site-packages), every call that writes,
deletes or lists below that folder reaches its target from there down, one part at a time, without
following a symbolic link (``O_NOFOLLOW`` and ``dir_fd``): a file or folder swapped for a link while a run
is under way is refused (:class:`LinkInTheWay`), never written through or over. Reading follows links
(``status`` and ``check`` read what a link points to), except :func:`read_file`, which reads the file
whose mode a write keeps.
"""

from __future__ import annotations

import contextlib
import contextvars
import errno
import fcntl
import os
import secrets
import stat as _stat
import tempfile
from pathlib import Path
from typing import Iterator

TEMP_SUFFIX = ".toolkit-tmp"

# the folder every write and delete below is confined to (no link followed from it down); None: none
_ROOT: contextvars.ContextVar[str | None] = contextvars.ContextVar("toolkit_fs_root", default=None)
# a folder on the way is opened only to be walked from (O_PATH: search permission is enough, as for a path)
_WALK_FLAGS = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC


class LinkInTheWay(OSError):
    """A symbolic link where toolkit was to write, delete or read a file whose mode it keeps."""

    def __init__(self, link: str) -> None:
        super().__init__(errno.ELOOP, "is a symbolic link", link)


@contextlib.contextmanager
def confined(root: Path | str) -> Iterator[None]:
    """Within: every write, delete or listing below ``root`` walks down from it following no link."""
    token = _ROOT.set(os.fspath(root))
    try:
        yield
    finally:
        _ROOT.reset(token)


def _parts_below(root: str, path: str) -> list[str] | None:
    """The parts of ``path`` below ``root`` ([] for ``root`` itself), or None when it is not below it."""
    if path == root:
        return []
    prefix = root.rstrip(os.sep) + os.sep
    if not path.startswith(prefix):
        return None
    return [part for part in path[len(prefix):].split(os.sep) if part and part != "."]


def _open_folder(root: str, parts: list[str], listing: bool = False) -> int:
    """A descriptor of ``root``/``parts``, opened one part at a time without following a link (readable
    when ``listing``; else only to be walked from). The root itself is trusted (site-packages, resolved)."""
    last = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC if listing else _WALK_FLAGS
    fd, current = os.open(root, last if not parts else _WALK_FLAGS), root
    try:
        for index, part in enumerate(parts):
            current = os.path.join(current, part)
            try:
                next_fd = os.open(part, (last if index == len(parts) - 1 else _WALK_FLAGS) | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(part, fd):
                    raise LinkInTheWay(current) from None
                exc.filename = current
                raise
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return _stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


@contextlib.contextmanager
def _in_folder(path: Path | str) -> Iterator[tuple[int | None, str]]:
    """(a descriptor of ``path``'s folder reached without links, ``path``'s name) when confined and ``path``
    lies below the root; (None, ``path``) otherwise, for a plain call."""
    root, target = _ROOT.get(), os.fspath(path)
    parts = None if root is None else _parts_below(root, os.path.dirname(target))
    if root is None or parts is None:
        yield None, target
        return
    fd = _open_folder(root, parts)
    try:
        yield fd, os.path.basename(target)
    finally:
        os.close(fd)


def _refuse_link_at(name: str, dir_fd: int | None, path: Path | str) -> None:
    with contextlib.suppress(FileNotFoundError):
        if _stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
            raise LinkInTheWay(os.fspath(path))


def read_bytes(path: Path) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def read_file(path: Path) -> tuple[bytes, int]:
    """The file's bytes and its mode bits, from the file itself (``fstat`` of a descriptor opened with
    ``O_NOFOLLOW``): a link here is :class:`LinkInTheWay`, never the link's own 0777."""
    with _in_folder(path) as (dir_fd, name):
        try:
            # O_NONBLOCK: a FIFO planted there does not hang the run (fstat then says it is no regular file)
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise LinkInTheWay(os.fspath(path)) from None
            exc.filename = os.fspath(path)
            raise
    try:
        mode = os.fstat(fd).st_mode
        if not _stat.S_ISREG(mode):
            raise IsADirectoryError(errno.EISDIR, "not a regular file", os.fspath(path))
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read(), mode & 0o7777
    finally:
        os.close(fd)


def lstat(path: str | Path) -> os.stat_result:
    return os.lstat(path)


def listdir(path: Path) -> list[str]:
    root = _ROOT.get()
    parts = None if root is None else _parts_below(root, os.fspath(path))
    if root is None or parts is None:
        return os.listdir(path)
    fd = _open_folder(root, parts, listing=True)  # a folder that is a link (a `__pycache__`) is refused, not listed
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)


def mkdir(path: Path, mode: int) -> None:
    """One directory, with exactly ``mode`` whatever the umask (chmod is not masked); never writable by
    others in between, even under umask 0 (created 0700 at most, then given ``mode``)."""
    with _in_folder(path) as (dir_fd, name):
        os.mkdir(name, 0o700, dir_fd=dir_fd)
        os.chmod(name, mode, dir_fd=dir_fd)


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


def unlink(path: Path | str) -> None:
    with _in_folder(path) as (dir_fd, name):
        os.unlink(name, dir_fd=dir_fd)  # a link itself goes, never what it points to


def rmdir(path: Path) -> None:
    with _in_folder(path) as (dir_fd, name):
        os.rmdir(name, dir_fd=dir_fd)


def replace(src: Path | str, dst: Path | str) -> None:
    """Rename ``src`` over ``dst``; confined, both in one folder reached without links, and ``dst`` never a
    link (renaming over one would leave a regular file that no revert turns back into the link)."""
    if os.path.dirname(os.fspath(src)) != os.path.dirname(os.fspath(dst)):
        os.replace(src, dst)
        return
    with _in_folder(dst) as (dir_fd, name):
        _refuse_link_at(name, dir_fd, dst)
        os.replace(os.path.basename(os.fspath(src)) if dir_fd is not None else src, name,
                   src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def mkstemp(directory: Path, name: str) -> tuple[int, str]:
    """A new file (0600, opened for writing) beside the files of ``directory``, named ``.<name>.*`` with
    :data:`TEMP_SUFFIX`; confined, in the folder reached without links."""
    with _in_folder(os.path.join(directory, name)) as (dir_fd, _):
        if dir_fd is None:
            return tempfile.mkstemp(prefix=f".{name}.", suffix=TEMP_SUFFIX, dir=directory)
        for _attempt in range(100):
            temp = f".{name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
            try:
                fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                             dir_fd=dir_fd)
            except FileExistsError:
                continue
            return fd, os.path.join(directory, temp)
    raise FileExistsError(errno.EEXIST, "no free temp file name", os.fspath(directory))


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
    with _in_folder(path) as (dir_fd, name):
        return os.open(name, flags, mode, dir_fd=dir_fd)


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
        fchmod(fd, mode)  # on the descriptor: a path could be a link by now
        fsync(fd, tmp_name)
        close(fd)
        is_open = False
    except BaseException:
        if is_open:
            with contextlib.suppress(OSError):
                os.close(fd)
        with contextlib.suppress(OSError):
            discard_temp(tmp_name)
        raise
    return tmp_name


def discard_temp(tmp_name: str) -> None:
    """Delete a temp file this run staged. When its folder was swapped for a link meanwhile, the temp
    went where the folder went: it is this run's own file (a name only it made), so it goes from there."""
    try:
        unlink(tmp_name)
    except LinkInTheWay:
        if not tmp_name.endswith(TEMP_SUFFIX):
            raise
        token = _ROOT.set(None)
        try:
            unlink(tmp_name)
        finally:
            _ROOT.reset(token)


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
            discard_temp(tmp_name)
        raise
    sync_dir(path.parent)


def read_or_none_with_mode(path: Path) -> tuple[bytes | None, int | None]:
    """:func:`read_file`, or (None, None) for a file that is not there."""
    try:
        return read_file(path)
    except (FileNotFoundError, NotADirectoryError):
        return None, None


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
