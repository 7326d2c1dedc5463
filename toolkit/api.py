"""The Python API: ``from toolkit import apply_patch, revert_patch, patch_status``."""

from __future__ import annotations

import contextlib
import math
import sys
from typing import TYPE_CHECKING, Callable, ContextManager, Sequence

from toolkit import engine as _engine
from toolkit.discovery import InstalledEngine, find_engines, interpreter
from toolkit.engine import PatchState, Result
from toolkit.errors import UsageError
from toolkit.patch_registry import Selection, select

if TYPE_CHECKING:
    from toolkit.repair import FetchRelease, RepairResult


def engines_of(selection: Selection, python: str | None) -> list[InstalledEngine]:
    """The installed engines of ``python`` that ``selection`` is about."""
    wanted = selection.engines()
    return [e for e in find_engines(python) if e.engine in wanted]


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
    if not patches:
        raise UsageError("patches=[] names no patch; pass patches=None for every patch")


def check_lock_timeout(lock_timeout: object) -> float:
    try:
        ok = not isinstance(lock_timeout, bool) and math.isfinite(lock_timeout) and lock_timeout >= 0  # type: ignore[arg-type]
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
          around: Around, options: dict) -> list[Result]:
    results = []
    for installed in installed_engines(selection, python, python_option=python_option):
        with around(installed):
            results.append(verb(installed, selection.named(installed.engine),
                                catalog=selection.catalog(installed.engine), **options))
    return results


def apply_each(selection: Selection, python: str | None = None, *, python_option: str = "python=PATH",
               around: Around = _no_spinner, **options: object) -> list[Result]:
    """Apply ``selection`` to each installed engine it is about (``options``: :func:`toolkit.engine.apply`'s
    force, dry_run, allow_unknown_version, allow_editable, lock_timeout); one :class:`Result` per engine."""
    return _each(_engine.apply, selection, python, python_option, around, options)


def revert_each(selection: Selection, python: str | None = None, *, python_option: str = "python=PATH",
                around: Around = _no_spinner, **options: object) -> list[Result]:
    """Revert ``selection`` (no patch named: every patch) on each installed engine it is about
    (``options``: :func:`toolkit.engine.revert`'s force, dry_run, lock_timeout)."""
    return _each(_engine.revert, selection, python, python_option, around, options)


def apply_patch(
    engine: str | None = None,
    patches: Sequence[str] | None = None,
    python: str | None = None,
    *,
    allow_unknown_version: bool = False,
    allow_editable: bool = False,
    force: bool = False,
    lock_timeout: float = _engine.DEFAULT_LOCK_TIMEOUT,
) -> bool:
    """Apply patches to the installed engine(s) of ``python`` (default: this interpreter).

    Returns True when files changed, False when everything was already applied. Raises :class:`toolkit.PatchError` (naming patch, file, anchor and engine version) on
    any failure, in which case nothing was written; :class:`toolkit.errors.UsageError` (a PatchError)
    when no engine it is about is installed, for ``patches=[]`` or a bad ``lock_timeout``.
    """
    check_patches_arg(patches)
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
    lock_timeout: float = _engine.DEFAULT_LOCK_TIMEOUT,
) -> bool:
    """Revert patches (default: all) byte-for-byte. True when files changed. With ``force``, files
    changed since they were patched are overwritten too, but only those the named patches edit."""
    check_patches_arg(patches)
    lock_timeout = check_lock_timeout(lock_timeout)
    results = revert_each(select(engine, patches), python, force=force, lock_timeout=lock_timeout)
    return any(result.changed for result in results)


def patch_status(engine: str | None = None, python: str | None = None) -> list[PatchState]:
    """One row per installed engine and patch: ``not applied``, ``applied``, ``partial`` or ``drifted``."""
    return [row for _, rows in status_each(select(engine), python) for row in rows]


def status_each(selection: Selection, python: str | None) -> list[tuple[InstalledEngine, list[PatchState]]]:
    """Each installed engine ``selection`` is about, with its status rows."""
    return [(installed, _engine.status(installed, catalog=selection.catalog(installed.engine)))
            for installed in engines_of(selection, python)]


def repair_engines(
    engine: str | None = None,
    python: str | None = None,
    *,
    fetch: "FetchRelease | None" = None,
    lock_timeout: float = _engine.DEFAULT_LOCK_TIMEOUT,
) -> list["RepairResult"]:
    """Put each installed engine back to its release's files (checked against pip's RECORD), clear its
    patch state, and remove the state of engines no longer installed. ``fetch(dist, version)`` gives
    the release wheel or tree (default: ``pip download``)."""
    from toolkit.discovery import site_dirs
    from toolkit.repair import RepairResult, orphan_states, repair

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
