"""The patches this toolkit knows (the ``toolkit.patches`` entry points) and the marker each leaves.

``registry()`` is the one place the patch list is read; tests replace it here
(``monkeypatch.setattr("toolkit.patch_registry.registry", ...)``), so every caller asks through this
module, never through a name imported from it.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

from toolkit.declare import Patch
from toolkit.errors import UsageError


def registry() -> list[Patch]:
    from toolkit.patches import all_patches

    return all_patches()


def patches_for(engine: str, patch_ids: Sequence[str] | None = None) -> list[Patch]:
    """The engine's patches in registry order; unknown ids are a usage error."""
    known = registry()
    if patch_ids:
        by_id = {p.id for p in known if p.engine == engine}
        unknown = [pid for pid in patch_ids if pid not in by_id]
        if unknown:
            raise UsageError(
                f"unknown patch for {engine}: {', '.join(unknown)} (known: {', '.join(sorted(by_id)) or 'none'})"
            )
    return [p for p in known if p.engine == engine and (not patch_ids or p.id in patch_ids)]


MARKER = re.compile(rb"# toolkit:([A-Za-z0-9_.-]+)")


def markers_in(data: bytes) -> set[str]:
    """The patch ids whose marker comment (``# toolkit:<id>``) a file carries."""
    return {match.decode() for match in MARKER.findall(data)}


def registry_order(engine: str, ids: Iterable[str]) -> list[str]:
    wanted = set(ids)
    known = [p.id for p in registry() if p.engine == engine and p.id in wanted]
    return known + sorted(wanted - set(known))  # ids this toolkit does not know stay visible
