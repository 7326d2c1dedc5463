"""The patches this toolkit knows (the ``toolkit.patches`` entry points) and the marker each leaves.

``registry()`` is the one place the patch list is read; tests replace it here
(``monkeypatch.setattr("toolkit.patch_registry.registry", ...)``), so every caller asks through this
module, never through a name imported from it. A command reads it once, at its edge: :func:`select`
turns the engine and patch ids a user wrote into a :class:`Selection` of ``Patch`` objects, and the
engine's :class:`Catalog` goes down with them, so nothing below looks an id up again.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from toolkit.declare import Patch
from toolkit.errors import UsageError

ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


def registry() -> list[Patch]:
    from toolkit.patches import all_patches

    return all_patches()


def did_you_mean(word: str, choices: Sequence[str]) -> str:
    """ "; did you mean X?" for a near miss among ``choices``, else ""."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def check_engine(engine: str | None) -> None:
    if engine is not None and engine not in ENGINE_NAMES:
        raise UsageError(f"unknown engine {engine!r}: expected vllm or sglang{did_you_mean(str(engine), list(ENGINE_NAMES))}")


@dataclass(frozen=True)
class Catalog:
    """One engine's registered patches, in the order they apply in (``after=``, then registry order)."""

    engine: str
    patches: tuple[Patch, ...]

    @property
    def ids(self) -> list[str]:
        return [p.id for p in self.patches]

    def relpaths(self) -> set[str]:
        """Every file one of the engine's patches edits, on any release (``Patch.files_for`` says which on one)."""
        return {edit.relpath for p in self.patches for edit in p.files}

    def select(self, patch_ids: Sequence[str] | None = None) -> list[Patch]:
        """The named patches (None or empty: all) in registry order; an unknown id is a usage error."""
        if patch_ids:
            unknown = [pid for pid in patch_ids if pid not in self.ids]
            if unknown:
                raise UsageError(f"unknown patch for {self.engine}: {', '.join(unknown)} "
                                 f"(known: {', '.join(sorted(self.ids)) or 'none'})")
        return [p for p in self.patches if not patch_ids or p.id in patch_ids]

    def ordered_between(self, first: str, second: str) -> bool:
        """Whether ``after=`` declarations (followed through other patches) order the two patches."""
        after = {p.id: set(p.after) for p in self.patches}

        def reaches(start: str, goal: str) -> bool:
            seen, todo = set(), [start]
            while todo:
                current = todo.pop()
                if current == goal:
                    return True
                if current not in seen:
                    seen.add(current)
                    todo.extend(after.get(current, ()))
            return False

        return reaches(first, second) or reaches(second, first)

    def order(self, patch_ids: Iterable[str]) -> list[str]:
        """``patch_ids`` in registry order; ids this toolkit does not know stay visible, last."""
        wanted = set(patch_ids)
        known = [pid for pid in self.ids if pid in wanted]
        return known + sorted(wanted - set(known))


def catalog(engine: str, known: Sequence[Patch] | None = None) -> Catalog:
    """The engine's patches among ``known`` (default: the registry, read now, for a caller that starts
    below a command's edge: tests, scripts), in the order they apply in (:func:`ordered`)."""
    return Catalog(engine, ordered([p for p in (registry() if known is None else known) if p.engine == engine]))


def ordered(patches: Sequence[Patch]) -> tuple[Patch, ...]:
    """``patches`` (one engine's) in the order they apply in: each after every patch among them that
    its ``after=`` names, otherwise in registry order. A circle of ``after=`` has no order: the
    registry is refused in one sentence naming the patches in it."""
    from toolkit.patches import RegistryError

    present = {p.id for p in patches}
    left, placed, done = list(patches), set(), []
    while left:
        ready = next((p for p in left if all(a in placed or a not in present for a in p.after)), None)
        if ready is None:
            circle = ", ".join(f"{p.id} after {'/'.join(a for a in p.after if a in present)}" for p in left)
            raise RegistryError(f"{left[0].engine} patches order each other in a circle with after= ({circle}): "
                                "no order applies them; drop one of those after= entries")
        left.remove(ready)
        placed.add(ready.id)
        done.append(ready)
    return tuple(done)


@dataclass(frozen=True)
class Selection:
    """What a command is about, resolved once: the engine named (or None), the patches named (None: no
    ``--patch``, every patch), and the registry they were resolved against."""

    engine: str | None
    patches: tuple[Patch, ...] | None
    known: tuple[Patch, ...]

    def engines(self) -> set[str]:
        """The engines the command may touch."""
        if self.engine is not None:
            return {self.engine}
        if self.patches is not None:
            return {p.engine for p in self.patches}
        return set(ENGINE_NAMES)

    def catalog(self, engine: str) -> Catalog:
        return catalog(engine, self.known)

    def named(self, engine: str) -> list[Patch] | None:
        """The named patches of ``engine`` (None: every patch)."""
        if self.patches is None:
            return None
        return [p for p in self.patches if p.engine == engine]

    def wanted_engines(self) -> str:
        """The engine(s) asked for, as users write them: "vLLM", "SGLang" or "vLLM or SGLang"."""
        names = sorted(self.engines(), key=list(ENGINE_NAMES).index)
        return " or ".join(ENGINE_NAMES[name] for name in names) or "vLLM or SGLang"


def select(engine: str | None = None, patch_ids: Sequence[str] | None = None) -> Selection:
    """Resolve a command's engine and patch ids against the registry, read once here. Every id names a
    known patch, and one of ``engine``'s when an engine is named: a patch id of another engine must
    never widen the command to all of this engine's patches."""
    check_engine(engine)
    known = tuple(registry())
    if not patch_ids:
        return Selection(engine, None, known)
    engines_of: dict[str, set[str]] = {}
    for p in known:
        engines_of.setdefault(p.id, set()).add(p.engine)
    unknown = sorted(set(patch_ids) - set(engines_of))
    if unknown:
        hint = did_you_mean(unknown[0], sorted(engines_of)) if len(unknown) == 1 else ""
        raise UsageError(f"unknown patch: {', '.join(unknown)}{hint} (see `toolkit list`)")
    if engine is not None:
        foreign = sorted(pid for pid in set(patch_ids) if engine not in engines_of[pid])
        if foreign:
            owners = ", ".join(f"{pid} is {'/'.join(sorted(engines_of[pid]))}'s" for pid in foreign)
            raise UsageError(f"not a patch of {engine}: {owners} (see `toolkit list {engine}`)")
    named = tuple(p for p in known if p.id in patch_ids and engine in (None, p.engine))
    return Selection(engine, named, known)


MARKER = re.compile(rb"# toolkit:([A-Za-z0-9_.-]+)")


def markers_in(data: bytes) -> set[str]:
    """The patch ids whose marker comment (``# toolkit:<id>``) a file carries."""
    return {match.decode() for match in MARKER.findall(data)}
