"""The patch engine called with patch ids, as the tests write them.

The engine takes ``Patch`` objects: a command resolves the ids a user wrote once, at its edge
(``patch_registry.select``), and nothing below looks an id up again. A test that drives the engine
directly is its own edge: each call here resolves its ids with ``Catalog.select`` against the catalog it
passes (default: the registry, read now), then hands the patches down.
"""

from __future__ import annotations

from typing import Any, Sequence

from toolkit import patch_registry
from toolkit.engine import patching


def _resolved(installed: Any, ids: Sequence[str] | None, catalog: Any) -> tuple[Any, Any]:
    catalog = catalog or patch_registry.catalog(installed.engine)
    if not ids:  # None: every patch; []: the engine's own usage error
        return catalog, ids
    return catalog, catalog.select(list(ids))


def apply(installed: Any, ids: Sequence[str] | None = None, *, catalog: Any = None, **options: Any) -> Any:
    catalog, patches = _resolved(installed, ids, catalog)
    return patching.apply(installed, patches, catalog=catalog, **options)


def revert(installed: Any, ids: Sequence[str] | None = None, *, catalog: Any = None, **options: Any) -> Any:
    catalog, patches = _resolved(installed, ids, catalog)
    return patching.revert(installed, patches, catalog=catalog, **options)
