"""Every patch this project ships, one package per patch per engine, found through an entry-point group.

A patch is declared by a ``PATCH`` object in its ``patch.py`` and registered in the entry-point group
``toolkit.patches`` (this project's own in pyproject.toml); another installed package can ship a
patch the same way. The patch engine finds patches only through :func:`all_patches`. Nothing is
imported at package import: a runtime module (``patches.<engine>.<patch>.runtime``) runs inside every
engine process and must not drag libcst and the patch engine in with it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolkit.codemod import Patch

ENTRY_POINT_GROUP = "toolkit.patches"


class RegistryError(Exception):
    """Two entry points declare the same patch, or one does not load; the message names them."""


OWN_DISTRIBUTION = "serving-toolkit"


def _own_first(entry) -> int:
    dist = getattr(entry, "dist", None)
    name = (getattr(dist, "name", "") or "").lower().replace("_", "-")
    return 0 if name == OWN_DISTRIBUTION else 1


def all_patches() -> list[Patch]:
    """Every registered patch: this project's in the order pyproject.toml lists them, then other
    packages' patches by engine and id (never by the order the environment lists distributions in,
    which differs between machines). The order patches apply in is that one, except where a patch
    declares ``after=`` (``toolkit.patch_registry.ordered``). Read afresh on each call (~13 ms): a
    command asks once, at its edge (``toolkit.patch_registry.select``)."""
    return _load_patches()


def _load_patches() -> list[Patch]:
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
