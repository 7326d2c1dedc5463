"""Codemod results kept on disk between processes, when ``TOOLKIT_CODEMOD_CACHE`` names a directory.

A codemod's result is a function of its inputs: the transformers' code, the source text, the engine
version, the finishing step and libcst. One process remembers its own results (toolkit/engine/transform.py);
this lets the next process that rewrites the same file the same way (the next ``toolkit apply-patch``,
another node of a cluster reading a shared directory, the test suite's many processes) read the text
instead of running libcst again: seconds per large file.

Only the patches of this distribution are kept: every transformer's module must lie under the
``toolkit`` package (``toolkit.patches`` included), whose ``.py`` files are all part of every key, with
libcst's and Python's versions. A change to any of them is a new key; a transformer from elsewhere (an
out-of-tree patch, a test's) is never kept. An entry that cannot be read is a miss, never an error; one
that cannot be written is skipped, and one in a folder another user could write is never read (an
entry is a pickle). Unset (the default), nothing is read or written.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any, Hashable, Sequence

from toolkit.engine import fs

CACHE_ENV = "TOOLKIT_CODEMOD_CACHE"
_FORMAT = 1
_fingerprint: str | None = None


def _roots() -> list[Path]:
    """The toolkit package's directory and those of ``toolkit.patches`` (in a checkout, patches/ is
    mapped onto it). The package's, not this module's folder: the codemods run on ``toolkit.codemod`` and
    ``toolkit.declare`` too, so an edit there must be a new key."""
    roots = [Path(__file__).resolve().parents[1]]
    try:
        spec = importlib.util.find_spec("toolkit.patches")
    except ImportError:
        spec = None
    locations = (spec.submodule_search_locations or ()) if spec is not None else ()
    roots.extend(Path(p).resolve() for p in locations)
    return roots


def _code_fingerprint() -> str:
    """sha256 over every ``.py`` file of the toolkit package (patches included), libcst and Python."""
    global _fingerprint
    if _fingerprint is None:
        import libcst

        digest = hashlib.sha256(f"{_FORMAT}\0{getattr(libcst, '__version__', '?')}\0{sys.version}\0".encode())
        for root in _roots():
            for path in sorted(root.rglob("*.py")):
                digest.update(f"{path.relative_to(root)}\0".encode())
                digest.update(hashlib.sha256(path.read_bytes()).digest())
        _fingerprint = digest.hexdigest()
    return _fingerprint


def _ours(transformers: Sequence[Any]) -> bool:
    roots = _roots()
    for transformer in transformers:
        module = sys.modules.get(getattr(transformer, "__module__", ""))
        path = getattr(module, "__file__", None)
        if not path or not any(Path(path).resolve().is_relative_to(root) for root in roots):
            return False
    return True


def entry_path(key: Hashable, transformers: Sequence[Any]) -> Path | None:
    """Where the result of ``key`` (toolkit.engine.transform's memo key) is kept, or None: no cache, or a
    transformer this cache does not know the code of."""
    directory = os.environ.get(CACHE_ENV)
    if not directory or not _ours(transformers):
        return None
    try:
        text = repr((_code_fingerprint(), _stable(key)))
    except Exception:  # noqa: BLE001 - a key part this cache cannot name the same way in every process
        return None
    return Path(directory) / hashlib.sha256(text.encode()).hexdigest()


def _stable(value: Any) -> Any:
    """``value`` with classes and functions named by module and qualified name (a repr that is the same
    in every process)."""
    if isinstance(value, tuple):
        return tuple(_stable(v) for v in value)
    if isinstance(value, type) or callable(value):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, (str, bytes, int, float, bool, type(None))):
        return value
    raise ValueError(f"not a stable key part: {type(value).__name__}")


def read(path: Path | None) -> Any:
    if path is None:
        return None
    try:
        # an entry is unpickled, which runs code: only one this user wrote, in a folder no one else can write
        if fs.writable_by_others(path.parent) or fs.writable_by_others(path):
            return None
        return pickle.loads(path.read_bytes())
    except Exception:  # noqa: BLE001 - missing, partial or foreign: a miss
        return None


def write(path: Path | None, value: Any) -> None:
    if path is None:
        return
    partial = None
    try:
        fs.make_dirs(path.parent)  # 0755 whatever the umask: read() refuses a folder others can write
        handle, partial = tempfile.mkstemp(dir=path.parent, prefix=".partial-")
        with os.fdopen(handle, "wb") as out:
            pickle.dump(value, out, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(partial, path)  # atomic: another process reads the whole entry or none
        partial = None
    except OSError:
        pass  # a cache that cannot be written is no cache: the result stands
    finally:
        if partial is not None:  # failed or interrupted (Ctrl-C) before the rename: no temp file left
            try:
                os.unlink(partial)
            except OSError:
                pass
