"""What the release cache (``$TOOLKIT_CACHE_DIR``: source trees, slim trees, wheels) holds: never more open
than 0755 for a folder and 0644 for a file whatever the umask (under umask 0, ``mkdir`` and pip made them
0777 and 0666: anyone could have edited what the matrix reads), and a wheel's files' sha256 from its RECORD.

Standard library only (``scripts/fetch_sources.py`` runs the release cache under any python 3).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import os
import re
import stat
import zipfile
from pathlib import Path

FOLDER_MODE = 0o755
FILE_MODE = 0o644


def restrict(path: Path) -> None:
    """``path`` and everything below it: every bit beyond 0755 (a folder) or 0644 (a file) taken off; what the
    umask took off stays off. Links are left alone (never followed)."""
    info = path.lstat()
    if stat.S_ISDIR(info.st_mode):
        for below in path.rglob("*"):
            _limit(below, below.lstat())
    _limit(path, info)


def _limit(path: Path, info: os.stat_result) -> None:
    if stat.S_ISLNK(info.st_mode):
        return
    mode = stat.S_IMODE(info.st_mode)
    allowed = FOLDER_MODE if stat.S_ISDIR(info.st_mode) else FILE_MODE
    if mode & ~allowed:
        os.chmod(path, mode & allowed)


def fresh_private_folder(path: Path) -> None:
    """``path`` empty and 0700 (what is built there is reachable by no one else until it is moved in place)."""
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)


def publish(folder: Path, dest: Path) -> None:
    """A tree built in a :func:`fresh_private_folder` made 0755/0644 at most and renamed to ``dest``."""
    restrict(folder)
    os.chmod(folder, FOLDER_MODE)
    os.replace(folder, dest)


def record_sha256(text: str) -> dict[str, str]:
    """A RECORD's rows as {path: sha256 hex digest}; rows without a sha256 (RECORD itself) are left out."""
    hashes = {}
    for row in csv.reader(text.splitlines()):
        if len(row) >= 2 and row[1].startswith("sha256="):
            digest = row[1][len("sha256="):]
            hashes[row[0]] = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
    return hashes


def record_of(origin: Path) -> dict[str, str]:
    """:func:`record_sha256` of the RECORD in the wheel or unpacked tree ``origin`` ({} without one)."""
    if origin.is_file():
        with zipfile.ZipFile(origin) as wheel:
            names = [n for n in wheel.namelist() if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
            return record_sha256(wheel.read(names[0]).decode("utf-8", "replace")) if names else {}
    found = sorted(origin.glob("*.dist-info/RECORD"))
    return record_sha256(found[0].read_text("utf-8", "replace")) if found else {}


def tree_damage(root: Path, hashes: object, marker: str) -> str | None:
    """Whether the tree ``root`` still holds exactly the files ``hashes`` ({path: sha256}) lists, ``marker``
    aside: the start of a sentence naming the first file that differs, is missing or was never listed (a
    reader would take an added file for the release's), or that there are no hashes; None when whole."""
    if not isinstance(hashes, dict):
        return f"{root} holds no sha256 of its files (cut by an older toolkit)"
    for name, want in sorted(hashes.items()):
        try:
            if hashlib.sha256((root / name).read_bytes()).hexdigest() != want:
                return f"{root / name} differs from the wheel's RECORD (edited since it was cut)"
        except OSError:
            return f"{root / name} is missing"
    for path in sorted(root.rglob("*")):
        name = path.relative_to(root).as_posix()
        if name != marker and not path.is_dir() and name not in hashes:
            return f"{path} is not a file of the wheel"
    return None
