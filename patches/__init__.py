"""Every patch this project ships, one package per patch per engine.

The patch engine finds patches only through :func:`all_patches`; importing a patch package imports
its declaration and codemods, never its runtime module (which runs inside the engine's process),
and importing a runtime module imports nothing of the patch engine.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from toolkit.codemod import Patch

# Module paths of patch declarations; each exposes ``PATCH``. Nothing is imported at package import:
# a runtime module (``patches.<engine>.<patch>.runtime``) runs inside every engine process and must
# not drag libcst and the patch engine in with it.
PATCH_MODULES: tuple[str, ...] = (
    "patches.sglang.token_ids.patch",
    "patches.sglang.tito.patch",
    "patches.sglang.superlinear_backend.patch",
    "patches.vllm.patch_sweep.patch",
    "patches.vllm.responses_stream.patch",
    "patches.vllm.tito.patch",
)


def all_patches() -> list[Patch]:
    return [importlib.import_module(name).PATCH for name in PATCH_MODULES]
