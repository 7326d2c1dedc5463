"""The Python API: ``from toolkit import apply_patch, revert_patch, patch_status``."""

from __future__ import annotations

from typing import Sequence

from toolkit import engine as _engine
from toolkit.discovery import InstalledEngine, find_engines
from toolkit.engine import PatchState
from toolkit.errors import UsageError


def resolve_engines(
    engine: str | None = None, patches: Sequence[str] | None = None, python: str | None = None
) -> list[InstalledEngine]:
    """The installed engines a command is about: the one named, the ones ``patches`` belong to, or all."""
    installed = find_engines(python)
    if engine is not None:
        if engine not in ("vllm", "sglang"):
            raise UsageError(f"unknown engine {engine!r}: expected vllm or sglang")
        return [e for e in installed if e.engine == engine]
    if patches:
        engines_of = {p.engine for p in _engine.registry() if p.id in patches}
        unknown = set(patches) - {p.id for p in _engine.registry()}
        if unknown:
            raise UsageError(f"unknown patch: {', '.join(sorted(unknown))}")
        return [e for e in installed if e.engine in engines_of]
    return installed


def _ids_for(engine: InstalledEngine, patches: Sequence[str] | None) -> list[str] | None:
    if not patches:
        return None
    return [pid for pid in patches if any(p.id == pid and p.engine == engine.engine for p in _engine.registry())]


def apply_patch(
    engine: str | None = None,
    patches: Sequence[str] | None = None,
    python: str | None = None,
    *,
    allow_unknown_version: bool = False,
) -> bool:
    """Apply patches to the installed engine(s) of ``python`` (default: this interpreter).

    Returns True when files changed, False when everything was already applied or no engine is
    installed. Raises :class:`toolkit.PatchError` (naming patch, file, anchor and engine version) on
    any failure, in which case nothing was written.
    """
    changed = False
    for installed in resolve_engines(engine, patches, python):
        result = _engine.apply(installed, _ids_for(installed, patches), allow_unknown_version=allow_unknown_version)
        changed = changed or bool(result.changed)
    return changed


def revert_patch(
    engine: str | None = None,
    patches: Sequence[str] | None = None,
    python: str | None = None,
    *,
    force: bool = False,
) -> bool:
    """Revert patches (default: all) byte-for-byte. True when files changed."""
    changed = False
    for installed in resolve_engines(engine, patches, python):
        result = _engine.revert(installed, _ids_for(installed, patches), force=force)
        changed = changed or bool(result.changed)
    return changed


def patch_status(engine: str | None = None, python: str | None = None) -> list[PatchState]:
    """One row per installed engine and patch: ``not applied``, ``applied``, ``partial`` or ``drifted``."""
    rows: list[PatchState] = []
    for installed in resolve_engines(engine, None, python):
        rows.extend(_engine.status(installed))
    return rows
