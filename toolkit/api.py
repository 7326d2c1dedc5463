"""The Python API: ``from toolkit import apply_patch, revert_patch, patch_status``."""

from __future__ import annotations

import contextlib
import math
import os
import sys
from typing import TYPE_CHECKING, Callable, ContextManager, Sequence

from toolkit.base.engines import ENGINE_NAMES
from toolkit.engine import patching
from toolkit.engine import interrupts
from toolkit.engine.discovery import InstalledEngine, find_engines, interpreter
from toolkit.engine.patching import Result
from toolkit.engine.status import PatchState
from toolkit.errors import UsageError
from toolkit.patch_registry import Selection, select

if TYPE_CHECKING:
    from toolkit.engine.repair import FetchRelease, RepairResult


def engines_of(selection: Selection, python: str | None) -> list[InstalledEngine]:
    """The installed engines of ``python`` that ``selection`` is about."""
    return installed_of(selection.engines(), python)


def installed_of(wanted: set[str] | None, python: str | None) -> list[InstalledEngine]:
    """The installed engines of ``python`` among ``wanted`` (None: every one); reads no registry."""
    return [e for e in find_engines(python) if wanted is None or e.engine in wanted]


def installed_engines(selection: Selection, python: str | None, *,
                      python_option: str = "python=PATH") -> list[InstalledEngine]:
    """:func:`engines_of`, but none installed is a usage error naming what is missing and where
    (``python_option``: how the caller names the interpreter option, ``--python PATH`` on the CLI)."""
    engines = engines_of(selection, python)
    if not engines:
        where = interpreter(python) or sys.executable
        raise UsageError(f"{selection.wanted_engines()} is not installed for {where}; install it or pass "
                         f"{python_option} (the engine's interpreter)")
    return engines


def check_patches_arg(patches: Sequence[str] | None) -> None:
    if patches is None:
        return
    if isinstance(patches, (str, bytes)):
        raise UsageError(f"patches must be a list of patch ids, not the string {patches!r}")
    try:
        ids = list(patches)
    except TypeError:
        raise UsageError(f"patches must be a list of patch ids, not {patches!r}") from None
    if not ids:
        raise UsageError("patches=[] names no patch; pass patches=None for every patch")
    wrong = [pid for pid in ids if not isinstance(pid, str)]
    if wrong:
        raise UsageError(f"patches must be a list of patch ids (strings); {wrong[0]!r} is not one")


def check_engine_arg(engine: object) -> None:
    """Before anything looks the engine up (an unhashable value would fail inside, as a TypeError)."""
    if engine is not None and not isinstance(engine, str):
        raise UsageError(f"engine must be {', '.join(map(repr, ENGINE_NAMES))} or None, not {engine!r}")


def python_arg(python: object) -> str | None:
    """``python`` as a path string: a str, an ``os.PathLike`` (``pathlib.Path``) or None (this interpreter)."""
    if python is None or isinstance(python, str):
        return python
    if isinstance(python, os.PathLike):
        path = os.fspath(python)
        if isinstance(path, str):
            return path
    raise UsageError(f"python must be a path to an interpreter (a str or a pathlib.Path) or None, not {python!r}")


def check_lock_timeout(lock_timeout: object) -> float:
    try:
        ok = not isinstance(lock_timeout, bool) and math.isfinite(lock_timeout) and lock_timeout >= 0  # type: ignore[arg-type, operator]
    except TypeError:
        ok = False
    if not ok:
        raise UsageError(f"lock_timeout must be a finite number >= 0 (seconds), not {lock_timeout!r}")
    return float(lock_timeout)  # type: ignore[arg-type]


# Called around each engine's apply or revert (the CLI's spinner); returns a context manager.
Around = Callable[[InstalledEngine], ContextManager[object]]


def _no_spinner(installed: InstalledEngine) -> ContextManager[object]:
    return contextlib.nullcontext()


def _each(verb: Callable[..., Result], selection: Selection, python: str | None, python_option: str,
          around: Around, options: dict[str, object], on_result: Callable[[Result], None] | None = None) -> list[Result]:
    results = []
    for installed in installed_engines(selection, python, python_option=python_option):
        # A signal after an engine's commit is delivered once ``on_result`` has recorded it (the CLI's
        # --json then reports that engine as committed); before the commit it stops the write at once.
        with interrupts.deferred():
            with around(installed):
                results.append(verb(installed, selection.named(installed.engine),
                                    catalog=selection.catalog(installed.engine), **options))
            if on_result is not None:
                on_result(results[-1])
    return results


def apply_each(selection: Selection, python: str | None = None, *, python_option: str = "python=PATH",
               around: Around = _no_spinner, on_result: Callable[[Result], None] | None = None,
               **options: object) -> list[Result]:
    """Apply ``selection`` to each installed engine it is about (``options``: :func:`toolkit.engine.patching.apply`'s
    force, dry_run, allow_unknown_version, allow_editable, lock_timeout); one :class:`Result` per engine,
    each also handed to ``on_result`` as soon as it is committed."""
    return _each(patching.apply, selection, python, python_option, around, options, on_result)


def revert_each(selection: Selection, python: str | None = None, *, python_option: str = "python=PATH",
                around: Around = _no_spinner, on_result: Callable[[Result], None] | None = None,
                **options: object) -> list[Result]:
    """Revert ``selection`` (no patch named: every patch) on each installed engine it is about
    (``options``: :func:`toolkit.engine.patching.revert`'s force, dry_run, lock_timeout; ``on_result`` as above)."""
    return _each(patching.revert, selection, python, python_option, around, options, on_result)


def apply_patch(
    engine: str | None = None,
    patches: Sequence[str] | None = None,
    python: str | None = None,
    *,
    allow_unknown_version: bool = False,
    allow_editable: bool = False,
    force: bool = False,
    lock_timeout: float = patching.DEFAULT_LOCK_TIMEOUT,
) -> bool:
    """Apply patches to the installed engine(s) of ``python`` (default: this interpreter).

    Returns True when files changed, False when everything was already applied. Raises
    :class:`toolkit.PatchError` (naming patch, file, anchor and engine version) on any failure, in which
    case nothing was written; :class:`toolkit.errors.UsageError` (a PatchError) when no engine it
    is about is installed, for ``patches=[]`` or a bad ``lock_timeout``.
    """
    check_engine_arg(engine)
    check_patches_arg(patches)
    python = python_arg(python)
    lock_timeout = check_lock_timeout(lock_timeout)
    results = apply_each(select(engine, patches), python, allow_unknown_version=allow_unknown_version,
                         allow_editable=allow_editable, force=force, lock_timeout=lock_timeout)
    return any(result.changed for result in results)


def revert_patch(
    engine: str | None = None,
    patches: Sequence[str] | None = None,
    python: str | None = None,
    *,
    force: bool = False,
    lock_timeout: float = patching.DEFAULT_LOCK_TIMEOUT,
) -> bool:
    """Revert patches (default: all) byte-for-byte. True when files changed. With ``force``, files
    changed since they were patched are overwritten too, but only those the named patches edit."""
    check_engine_arg(engine)
    check_patches_arg(patches)
    python = python_arg(python)
    lock_timeout = check_lock_timeout(lock_timeout)
    results = revert_each(select(engine, patches), python, force=force, lock_timeout=lock_timeout)
    return any(result.changed for result in results)


def patch_status(engine: str | None = None, python: str | None = None) -> list[PatchState]:
    """One row per installed engine and patch: ``not applied``, ``applied``, ``partial`` or ``drifted``."""
    check_engine_arg(engine)
    return [row for _, rows in status_each(select(engine), python_arg(python)) for row in rows]


def status_each(selection: Selection, python: str | None) -> list[tuple[InstalledEngine, list[PatchState]]]:
    """Each installed engine ``selection`` is about, with its status rows."""
    return [(installed, patching.status(installed, catalog=selection.catalog(installed.engine)))
            for installed in engines_of(selection, python)]


def repair_engines(
    engine: str | None = None,
    python: str | None = None,
    *,
    fetch: "FetchRelease | None" = None,
    lock_timeout: float = patching.DEFAULT_LOCK_TIMEOUT,
) -> list["RepairResult"]:
    """Put each installed engine back to its release's files (checked against pip's RECORD), clear its
    patch state, and remove the state of engines no longer installed. ``fetch(dist, version)`` gives
    the release wheel or tree (default: ``pip download``)."""
    from toolkit.engine.discovery import site_dirs
    from toolkit.engine.repair import RepairResult, orphan_states, repair

    check_engine_arg(engine)
    python = python_arg(python)
    selection = select(engine)
    lock_timeout = check_lock_timeout(lock_timeout)
    installed = find_engines(python)
    results = [repair(e, fetch, lock_timeout, catalog=selection.catalog(e.engine))
               for e in installed if engine in (None, e.engine)]
    for state in orphan_states(site_dirs(python), installed):
        name = state.root.name
        if engine in (None, name):
            state.remove_all()
            results.append(RepairResult(name, "", "", cleared_state=True, orphan=True))
    return results
