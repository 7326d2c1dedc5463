"""Cached bytecode under ``PYTHONPYCACHEPREFIX``: where a process with a pycache prefix writes a module's
``.pyc`` (the prefix's mirror of the source's folder, not ``__pycache__``), which the patch engine deletes
with the rest when it replaces the source (``toolkit.engine.state.remove_stale_bytecode``)."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Callable

from toolkit.engine import fs


def remove_under_prefix(source: Path, is_bytecode_of: Callable[[str, str], bool]) -> None:
    """The bytecode of ``source`` under this process's pycache prefix (none when unset): the prefix mirrors
    the source's folder as the importing process named it, so both the path as given and resolved."""
    prefix = sys.pycache_prefix
    if not prefix:
        return
    for folder in dict.fromkeys((source.parent.absolute(), source.parent.resolve())):
        remove_in(Path(prefix) / str(folder).lstrip(os.sep), source.stem, is_bytecode_of)


def remove_in(cache_dir: Path, stem: str, is_bytecode_of: Callable[[str, str], bool]) -> None:
    """Delete the bytecode of module ``stem`` in the folder ``cache_dir`` (nothing when there is no folder)."""
    try:
        names = fs.listdir(cache_dir)
    except (FileNotFoundError, NotADirectoryError):
        return
    for name in names:
        if is_bytecode_of(stem, name):
            with contextlib.suppress(FileNotFoundError):
                fs.unlink(cache_dir / name)
