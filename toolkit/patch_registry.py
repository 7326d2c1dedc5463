"""The registry, in one module: the patches this toolkit knows (the ``toolkit.patches`` entry points, this
project's and other installed packages'), the order they apply in, a command's selection of them, the
engine plugins this package ships, the ``verify --checks`` names, and the marker each patch leaves.

A patch is declared by a ``PATCH`` object in its ``patch.py`` and registered in the entry-point group
``toolkit.patches`` (this project's own in pyproject.toml); another installed package can ship a patch
the same way. ``registry()`` is the one place the patch list is read; tests replace it here
(``monkeypatch.setattr("toolkit.patch_registry.registry", ...)``), so every caller asks through this
module, never through a name imported from it. A command reads it once, at its edge: :func:`select`
turns the engine and patch ids a user wrote into a :class:`Selection` of ``Patch`` objects, and the
engine's :class:`Catalog` goes down with them, so nothing below looks an id up again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from toolkit.base import engines
from toolkit.base.suggest import did_you_mean
from toolkit.kit._declare import Patch
from toolkit.errors import RegistryError, UsageError

ENTRY_POINT_GROUP = "toolkit.patches"
OWN_DISTRIBUTION = "serving-toolkit"


def registry() -> list[Patch]:
    """Every registered patch, read afresh from the entry points (~13 ms): a command asks once, at its
    edge (:func:`select`)."""
    return all_patches()


def all_patches() -> list[Patch]:
    """Every registered patch: this project's in the order pyproject.toml lists them, then other
    packages' patches by engine and id (never by the order the environment lists distributions in,
    which differs between machines). The order patches apply in is that one, except where a patch
    declares ``after=`` (:func:`ordered`)."""
    from importlib.metadata import entry_points

    found: dict[tuple[str, str], tuple[str, Patch]] = {}
    foreign: set[tuple[str, str]] = set()
    for entry in sorted(entry_points(group=ENTRY_POINT_GROUP), key=_own_first):  # stable: keeps our file order
        try:
            patch = entry.load()
        except Exception as exc:  # a broken third-party patch must say which one it is
            raise RegistryError(f"patch entry point {entry.name} = {entry.value} does not load: {exc}") from exc
        key = (patch.engine, patch.id)
        if key in found and found[key][0] != entry.value:
            raise RegistryError(f"two entry points declare {patch.engine} patch {patch.id}: "
                                f"{found[key][0]} and {entry.value}")
        found[key] = (entry.value, patch)
        if _own_first(entry):
            foreign.add(key)
    own = [patch for key, (_, patch) in found.items() if key not in foreign]
    return own + [found[key][1] for key in sorted(foreign)]


def _own_first(entry: object) -> int:
    dist = getattr(entry, "dist", None)
    name = (getattr(dist, "name", "") or "").lower().replace("_", "-")
    return 0 if name == OWN_DISTRIBUTION else 1


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

    def recorded(self, patch_ids: Iterable[str]) -> tuple[list[Patch], list[str]]:
        """The patches a manifest records, in the order they apply in, and the recorded ids that are none of
        this engine's (sorted): the one place below a command's edge where an id meets a Patch."""
        wanted = set(patch_ids)
        return [p for p in self.patches if p.id in wanted], sorted(wanted - set(self.ids))

    def ordered(self, patches: Iterable[Patch]) -> list[Patch]:
        """``patches`` (the catalog's own) in the order they apply in."""
        wanted = set(patches)
        return [p for p in self.patches if p in wanted]

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
        return set(engines.ENGINE_NAMES)

    def catalog(self, engine: str) -> Catalog:
        return catalog(engine, self.known)

    def named(self, engine: str) -> list[Patch] | None:
        """The named patches of ``engine`` (None: every patch)."""
        if self.patches is None:
            return None
        return [p for p in self.patches if p.engine == engine]

    def wanted_engines(self) -> str:
        """The engine(s) asked for, as users write them: "vLLM", "SGLang" or "vLLM or SGLang"."""
        return engines.titles(self.engines()) or engines.titles()


def select(engine: str | None = None, patch_ids: Sequence[str] | None = None) -> Selection:
    """Resolve a command's engine and patch ids against the registry, read once here. Every id names a
    known patch, and one of ``engine``'s when an engine is named: a patch id of another engine must
    never widen the command to all of this engine's patches."""
    engines.check_engine(engine)
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


@dataclass(frozen=True)
class Plugin:
    """An engine plugin this package ships: what the engine loads through its own entry point, no patch."""

    id: str
    engine: str
    versions: str  # the releases it is proved on (PEP 440 range)
    entry_point: str  # the engine's entry-point group
    switch: str  # how a user turns it on
    summary: str
    notes: str = ""  # where it is not proved, and why


def plugins() -> list[Plugin]:
    """The engine plugins `toolkit list` shows beside the patches, each with the releases it is proved on,
    read from the plugin's own module (the module refuses, or names as not needed, what lies outside)."""
    from toolkit.patches.sglang.superlinear import plugin as sglang_plugin
    from toolkit.patches.vllm.superlinear import plugin as vllm_plugin

    return [
        Plugin("superlinear-plugin", "sglang", f"{sglang_plugin.SGLANG_RELEASES},<=0.5.23", "sglang.srt.plugins",
               "TOOLKIT_ATTENTION_BACKEND=superlinear, then --attention-backend superlinear",
               "superlinear attention as an SGLang attention backend (CPU included)",
               "SGLang 0.5.9 and 0.5.10 have no plugin loader: the superlinear-backend patch serves there"),
        Plugin("superlinear-plugin", "vllm", vllm_plugin.VLLM_RELEASES, "vllm.general_plugins",
               "TOOLKIT_ATTENTION_BACKEND=superlinear (on GPU, then --attention-backend CUSTOM)",
               "superlinear attention as vLLM's CPU attention backend, and as AttentionBackendEnum.CUSTOM on GPU",
               f"GPU (CUDA) only {vllm_plugin.CUDA_VLLM_RELEASES}: vLLM's Triton attention backend, which the CUDA "
               "backend builds on, is another module before 0.32 and was never tried there"),
    ]
