"""Every patch this project ships, one package per patch per engine, each registered in the entry-point
group ``toolkit.patches`` (pyproject.toml). The registry that reads them is ``toolkit.patch_registry``;
its ``all_patches``, ``ENTRY_POINT_GROUP`` and ``RegistryError`` stay importable here for code written against this path.
Nothing is imported at package import: a runtime module (``patches.<engine>.<patch>.runtime``) runs
inside every engine process and must not drag libcst and the patch engine in with it.
"""

from __future__ import annotations

from toolkit.base.lazy import lazy_attributes

__getattr__ = lazy_attributes(__name__, {"all_patches": "toolkit.patch_registry",
                                         "ENTRY_POINT_GROUP": "toolkit.patch_registry",
                                         "RegistryError": "toolkit.errors"}, globals())
