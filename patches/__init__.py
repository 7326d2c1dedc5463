"""Every patch this project ships, one package per patch per engine.

The patch engine finds patches only through :func:`all_patches`; importing a patch package imports
its declaration and codemods, never its runtime module (which runs inside the engine's process).
"""

from __future__ import annotations

import importlib

from toolkit.codemod import Patch

# Module paths of patch packages; each exposes ``PATCH``.
PATCH_MODULES: tuple[str, ...] = (
    "patches.sglang.token_ids",
    "patches.vllm.responses_stream",
    "patches.vllm.tito",
)


def all_patches() -> list[Patch]:
    return [importlib.import_module(name).PATCH for name in PATCH_MODULES]
