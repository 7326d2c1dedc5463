"""The Python API: ``from toolkit import apply_patch, revert_patch, patch_status``."""

from __future__ import annotations

import difflib
import math
import sys
from typing import TYPE_CHECKING, Sequence

from toolkit import engine as _engine
from toolkit import patch_registry
from toolkit.discovery import InstalledEngine, find_engines, interpreter
from toolkit.engine import PatchState
from toolkit.errors import UsageError

if TYPE_CHECKING:
    from toolkit.repair import FetchRelease, RepairResult


def resolve_engines(
    engine: str | None = None, patches: Sequence[str] | None = None, python: str | None = None
) -> list[InstalledEngine]:
    """The installed engines a command is about: the one named, the ones ``patches`` belong to, or all."""
    check_engine(engine)
    if patches:
        _check_patch_ids(engine, patches)
    installed = find_engines(python)
    if engine is not None:
        return [e for e in installed if e.engine == engine]
    if patches:
        engines_of = {p.engine for p in patch_registry.registry() if p.id in patches}
        return [e for e in installed if e.engine in engines_of]
    return installed


ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """ "; did you mean X?" for a near miss among ``choices``, else ""."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def check_engine(engine: str | None) -> None:
    if engine is not None and engine not in ENGINE_NAMES:
        raise UsageError(f"unknown engine {engine!r}: expected vllm or sglang{did_you_mean(str(engine), list(ENGINE_NAMES))}")


def wanted_engines(engine: str | None, patches: Sequence[str] | None) -> str:
    """The engine(s) a command asks for, as users write them: "vLLM", "SGLang" or "vLLM or SGLang"."""
    if engine is not None:
        names = {engine}
    elif patches:
        names = {p.engine for p in patch_registry.registry() if p.id in patches}
    else:
        names = set(ENGINE_NAMES)
    return " or ".join(ENGINE_NAMES.get(name, name) for name in sorted(names, key=list(ENGINE_NAMES).index)) or "vLLM or SGLang"


def installed_engines(engine: str | None, patches: Sequence[str] | None, python: str | None, *,
                      python_option: str = "python=PATH") -> list[InstalledEngine]:
    """:func:`resolve_engines`, but none installed is a usage error naming what is missing and where
    (``python_option``: how the caller names the interpreter option, ``--python PATH`` on the CLI)."""
    engines = resolve_engines(engine, patches, python)
    if not engines:
        where = interpreter(python) or sys.executable
        raise UsageError(f"{wanted_engines(engine, patches)} is not installed for {where}; install it or pass "
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


def _check_patch_ids(engine: str | None, patches: Sequence[str]) -> None:
    """Every id names a known patch, and one of ``engine``'s when an engine is named: a patch id of
    another engine must never widen the command to all of this engine's patches."""
    engines_of: dict[str, set[str]] = {}
    for p in patch_registry.registry():
        engines_of.setdefault(p.id, set()).add(p.engine)
    unknown = sorted(set(patches) - set(engines_of))
    if unknown:
        hint = did_you_mean(unknown[0], sorted(engines_of)) if len(unknown) == 1 else ""
        raise UsageError(f"unknown patch: {', '.join(unknown)}{hint} (see `toolkit list`)")
    if engine is not None:
        foreign = sorted(pid for pid in set(patches) if engine not in engines_of[pid])
        if foreign:
            owners = ", ".join(f"{pid} is {'/'.join(sorted(engines_of[pid]))}'s" for pid in foreign)
            raise UsageError(f"not a patch of {engine}: {owners} (see `toolkit list {engine}`)")


def ids_for(engine: InstalledEngine, patches: Sequence[str] | None) -> list[str] | None:
    """The ids of ``patches`` that belong to ``engine`` (None: no --patch given, every patch)."""
    if not patches:
        return None
    return [pid for pid in patches if any(p.id == pid and p.engine == engine.engine for p in patch_registry.registry())]


def apply_patch(
    engine: str | None = None,
    patches: Sequence[str] | None = None,
    python: str | None = None,
    *,
    allow_unknown_version: bool = False,
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
    changed = False
    for installed in installed_engines(engine, patches, python):
        result = _engine.apply(installed, ids_for(installed, patches), allow_unknown_version=allow_unknown_version,
                               force=force, lock_timeout=lock_timeout)
        changed = changed or bool(result.changed)
    return changed


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
    changed = False
    for installed in installed_engines(engine, patches, python):
        result = _engine.revert(installed, ids_for(installed, patches), force=force, lock_timeout=lock_timeout)
        changed = changed or bool(result.changed)
    return changed


def patch_status(engine: str | None = None, python: str | None = None) -> list[PatchState]:
    """One row per installed engine and patch: ``not applied``, ``applied``, ``partial`` or ``drifted``."""
    rows: list[PatchState] = []
    for installed in resolve_engines(engine, None, python):
        rows.extend(_engine.status(installed))
    return rows


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

    check_engine(engine)
    lock_timeout = check_lock_timeout(lock_timeout)
    installed = find_engines(python)
    results = [repair(e, fetch, lock_timeout) for e in installed if engine in (None, e.engine)]
    for state in orphan_states(site_dirs(python), installed):
        name = state.root.name
        if engine in (None, name):
            state.remove_all()
            results.append(RepairResult(name, "", "", cleared_state=True, orphan=True))
    return results
