"""toolkit: versioned codemods that make installed vLLM and SGLang engines do what RL and
interpretability work needs, without a fork."""

from __future__ import annotations

__version__ = "0.1.0"

from toolkit.api import apply_patch, patch_status, revert_patch  # noqa: E402
from toolkit.errors import PatchError  # noqa: E402

__all__ = ["__version__", "apply_patch", "revert_patch", "patch_status", "PatchError"]
