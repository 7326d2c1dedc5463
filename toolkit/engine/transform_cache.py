"""Codemod results kept on disk between processes, when ``TOOLKIT_CODEMOD_CACHE`` names a directory.

A codemod's result is a function of its inputs: the transformers' code, the source text, the engine
version, the finishing step and libcst. One process remembers its own results (toolkit/engine/transform.py);
this lets the next process that rewrites the same file the same way (the next ``toolkit apply-patch``,
another node of a cluster reading a shared directory, the test suite's many processes) read the text
instead of running libcst again: seconds per large file.

Only the patches of this distribution are kept: every transformer's module must lie under the
``toolkit`` package (``toolkit.patches`` included). Part of every key, with libcst's and Python's versions: the
code that decides the result, the ``.py`` files of the transformers' modules, of this engine's transform and
guard (the finishing step), and of every module of the package they import, found by reading their imports
(lazy ones too) with ``ast``. An edit to any of them is a new key; an edit elsewhere in the package (the CLI,
the verifier) keeps the entries. A transformer from elsewhere (an out-of-tree patch, a test's) is never kept.
An entry that cannot be read is a miss, never an error; one that cannot be written is skipped, and one in a
folder another user could write is never read (an entry is a pickle). Unset (the default), nothing is read or written.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import pickle
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Hashable, Sequence

from toolkit.engine import fs

CACHE_ENV = "TOOLKIT_CODEMOD_CACHE"
_FORMAT = 1
_fingerprints: dict[frozenset[str], str] = {}  # per set of transformer modules, once a process


def _roots() -> list[Path]:
    """The toolkit package's directory and those of ``toolkit.patches`` (in a checkout, patches/ is
    mapped onto it): where a transformer must live to be kept."""
    roots = [Path(__file__).resolve().parents[1]]
    try:
        spec = importlib.util.find_spec("toolkit.patches")
    except ImportError:
        spec = None
    locations = (spec.submodule_search_locations or ()) if spec is not None else ()
    roots.extend(Path(p).resolve() for p in locations)
    return roots


# The engine's own modules that run every codemod: the transform and the finishing step (the guard).
_ENGINE_MODULES = ("toolkit.engine.transform", "toolkit.engine.guard", "toolkit.engine.transform_cache")


def _module_file(name: str) -> Path | None:
    """The source file of module ``name`` of this package, or None (not a module: a name inside one). Found
    in the folders of its parent package, never by importing anything (a package's ``__init__`` runs code)."""
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None) if module is not None else None
    if path is None:
        parent, _, leaf = name.rpartition(".")
        loaded = sys.modules.get(parent) if parent else None
        if loaded is not None:
            folders = list(getattr(loaded, "__path__", None) or [])
        else:
            parent_file = _module_file(parent) if parent else None
            folders = [str(parent_file.parent)] if parent_file is not None and parent_file.name == "__init__.py" else []
        candidates = [Path(f, leaf + ".py") for f in folders] + [Path(f, leaf, "__init__.py") for f in folders]
        path = next((str(c) for c in candidates if c.is_file()), None)
    return Path(path).resolve() if path and path.endswith(".py") else None


def imported_names(tree: ast.AST, name: str, is_package: bool, is_module: Callable[[str], bool]
                   ) -> list[tuple[str, int]]:
    """What module ``name``'s code (``tree``) imports, anywhere in it, each with its line: ``from pkg import
    module`` names ``pkg.module`` (when ``is_module`` says it is one), ``from pkg import name`` names ``pkg``.
    tests/architecture/import_graph.py builds the project's import graph with it too."""
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                target = ".".join(base[: len(base) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                submodule = f"{target}.{alias.name}"
                out.append((submodule if is_module(submodule) else target, node.lineno))
    return out


def _imported(path: Path, name: str) -> set[str]:
    """The modules of this package that the module ``name`` at ``path`` imports, anywhere in its code."""
    tree = ast.parse(path.read_bytes(), str(path))
    found = imported_names(tree, name, path.name == "__init__.py", lambda module: _module_file(module) is not None)
    return {target for target, _ in found if target.startswith("toolkit.")}


def key_files(modules: Sequence[str]) -> dict[str, Path]:
    """Module name -> file of ``modules``, the engine's transform and guard, and every module of this package
    they import, and those import, read with ``ast``."""
    files: dict[str, Path] = {}
    pending = [*modules, *_ENGINE_MODULES]
    while pending:
        name = pending.pop()
        if name in files:
            continue
        path = _module_file(name)
        if path is None:
            continue
        files[name] = path
        pending.extend(_imported(path, name) - files.keys())
    return files


def _code_fingerprint(modules: Sequence[str]) -> str:
    """sha256 over the files :func:`key_files` names (each by its module name), libcst and Python."""
    wanted = frozenset(modules)
    if wanted not in _fingerprints:
        import libcst

        digest = hashlib.sha256(f"{_FORMAT}\0{getattr(libcst, '__version__', '?')}\0{sys.version}\0".encode())
        for name, path in sorted(key_files(sorted(wanted)).items()):
            digest.update(f"{name}\0".encode())
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        _fingerprints[wanted] = digest.hexdigest()
    return _fingerprints[wanted]


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
        text = repr((_code_fingerprint([t.__module__ for t in transformers]), _stable(key)))
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
