"""``toolkit own-tests``: which of an engine's own test files exercise the modules the patches edit (no
engine, no network: ``tests/scripts_own_tests`` checks it on trees it writes), and the pytest plugins the
runs load."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

# Upstream test files that start a real engine server (vLLM's `vllm serve` wrappers in tests/utils.py,
# SGLang's `popen_launch_server` in sglang.test.test_utils, which the sglang wheel ships): run, but with
# the server refused (SERVER_PLUGIN) unless asked, so their unit tests count and their server tests are
# named as not run (each server costs a minute of CPU and, offline, fails on the hub download anyway).
SERVER_MARKERS = ("RemoteOpenAIServer", "RemoteVLLMServer", "popen_launch_server")
# module -> the names in it that start a server (a class: its __init__ refused; a function: replaced)
SERVER_STARTERS = (("tests.utils", ("RemoteOpenAIServer", "RemoteVLLMServer")),
                   ("sglang.test.test_utils", ("popen_launch_server",)))
NO_SERVER = "engine server not started (toolkit own-tests --with-servers starts them)"
SERVER_PLUGIN = f"""
import importlib

import pytest

def _refuse(*args, **kwargs):
    raise RuntimeError({NO_SERVER!r})

@pytest.hookimpl(tryfirst=True)
def pytest_collection(session):
    # before the test modules import them, so a `from ... import popen_launch_server` binds the refusal
    for module_name, names in {SERVER_STARTERS!r}:
        try:
            module = importlib.import_module(module_name)
        except Exception:
            continue
        for name in names:
            starter = getattr(module, name, None)
            if isinstance(starter, type):
                starter.__init__ = _refuse
            elif starter is not None:
                setattr(module, name, _refuse)
"""

# vLLM's tests/conftest.py cleans up after every test (cleanup_fixture -> cleanup_dist_env_and_memory): the
# distributed state, then gc.collect() and the accelerator's caches. On these CPUs the collection alone takes
# about a second a test (hours over the chosen files); this keeps the distributed part, the only state a
# CPU test leaves, on the release and patched runs alike.
CPU_CLEANUP_PLUGIN = """
def pytest_plugin_registered(plugin, manager):
    if getattr(plugin, "__name__", "").rpartition(".")[2] != "conftest" \\
            or not callable(getattr(plugin, "cleanup_dist_env_and_memory", None)):
        return
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    def cleanup_dist_env(shutdown_ray=False):
        destroy_model_parallel()
        destroy_distributed_environment()
        if shutdown_ray:
            import ray
            ray.shutdown()

    plugin.cleanup_dist_env_and_memory = cleanup_dist_env
"""


def module_of(package: str, relpath: str) -> str:
    """``vllm`` + ``v1/core/kv_cache_utils.py`` -> ``vllm.v1.core.kv_cache_utils`` (``__init__.py``: the package)."""
    parts = [package, *Path(relpath).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def public_names(source: str) -> set[str]:
    """The names a module defines at top level (functions, classes, assignments), not ``_private`` ones."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    names.add(target.id)
    return {name for name in names if not name.startswith("_")}


@dataclass(frozen=True)
class Target:
    """A module one of our patches edits, with what its parent packages re-export of it: a test that
    writes ``from vllm.entrypoints.openai.chat_completion import X`` exercises the module defining X."""

    module: str
    names: frozenset[str] = frozenset()
    # parent package -> the module's public names that parent's __init__.py mentions (re-exports)
    reexports: tuple[tuple[str, frozenset[str]], ...] = ()


def make_target(package_root: Path | Callable[[str], bytes | None], package: str, relpath: str) -> Target:
    """The target for ``relpath`` of the engine package at ``package_root`` (the release's files), or read
    through ``package_root(relpath)`` (``SourceTree.read``: None where the file is not there)."""
    def read(rel: str) -> str | None:
        if callable(package_root):
            data = package_root(rel)
            return None if data is None else data.decode("utf-8", errors="replace")
        path = package_root / rel
        return path.read_text(encoding="utf-8") if path.is_file() else None

    module = module_of(package, relpath)
    source = read(relpath)
    names = frozenset(public_names(source)) if source is not None else frozenset()
    reexports = []
    parts = Path(relpath).with_suffix("").parts[:-1]
    for depth in range(len(parts), -1, -1):
        text = read("/".join([*parts[:depth], "__init__.py"]))
        if text is None:
            continue
        exported = frozenset(name for name in names if re.search(rf"\b{re.escape(name)}\b", text))
        if exported:
            reexports.append((".".join([package, *parts[:depth]]), exported))
    return Target(module, names, tuple(reexports))


def parent_inits(relpath: str) -> list[str]:
    """The ``__init__.py`` files above ``relpath`` (what :func:`make_target` reads for re-exports)."""
    parts = Path(relpath).parts[:-1]
    return ["/".join([*parts[:depth], "__init__.py"]) for depth in range(len(parts) + 1)]


def exercised_modules(source: str, targets: Iterable[Target]) -> set[str]:
    """The target modules a test file imports (the module, a submodule, the module from its parent, or a
    name its parent re-exports) or names in a string (``mock.patch("vllm.v1.core.kv_cache_utils.f")``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    hits: set[str] = set()
    targets = list(targets)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                hits |= {t.module for t in targets if _within(alias.name, t.module)}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported = {alias.name for alias in node.names}
            for t in targets:
                if _within(node.module, t.module):
                    hits.add(t.module)
                elif t.module.startswith(node.module + "."):
                    reexported = dict(t.reexports).get(node.module, frozenset())
                    if t.module[len(node.module) + 1:] in imported or imported & reexported:
                        hits.add(t.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            hits |= {t.module for t in targets if _within(node.value.split(":")[0], t.module)}
    return hits


def _within(name: str, module: str) -> bool:
    return name == module or name.startswith(module + ".")


@dataclass
class Selection:
    """The test files chosen: file -> target modules it exercises; and notes on some of them (servers refused)."""

    files: dict[str, list[str]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def select_test_files(tests_root: Path, targets: list[Target], under: Sequence[str] = (),
                      with_servers: bool = False, tests_dir: str = "tests") -> Selection:
    """Every ``test_*.py`` below ``tests_root/tests_dir`` (vLLM's sdist: ``tests``, SGLang's sources:
    ``test``) that exercises a target, restricted to the paths starting with one of ``under`` (relative
    to ``tests_root``) when given."""
    chosen = Selection()
    for path in sorted((tests_root / tests_dir).rglob("test_*.py")):
        rel = path.relative_to(tests_root).as_posix()
        if under and not any(rel.startswith(prefix.rstrip("/") + ("/" if not prefix.endswith(".py") else ""))
                             or rel == prefix for prefix in under):
            continue
        source = path.read_text(encoding="utf-8", errors="replace")
        hits = exercised_modules(source, targets)
        if not hits:
            continue
        chosen.files[rel] = sorted(hits)
        if not with_servers and any(marker in source for marker in SERVER_MARKERS):
            chosen.notes[rel] = "its server tests run with the server refused (--with-servers starts it)"
    return chosen


def nearest(selection: Selection, package: str, tests_dir: str = "tests") -> Selection:
    """Of ``selection``, the files nearest the edited code: below the test folder that mirrors the package
    of a module the file exercises (vLLM lays its tests out like its sources: ``vllm/v1/core/kv_cache_utils.py``
    is tested in ``tests/v1/core/``), or named for that module (``test_kv_cache_utils.py``). The others import
    an edited module for a type or a helper (a KV connector's tests import ``KVCacheBlock``); there are
    thousands of them, hours on a CPU: ``--scope all`` runs them too."""
    near = Selection()
    for file, modules in selection.files.items():
        for module in modules:
            parts = module.split(".")[1:] if module.startswith(package + ".") else []
            if not parts:
                continue
            folder = "/".join([tests_dir, *parts[:-1]]) + "/"
            if file.startswith(folder) or Path(file).name == f"test_{parts[-1]}.py":
                near.files[file] = modules
                break
    near.notes = {file: note for file, note in selection.notes.items() if file in near.files}
    return near
