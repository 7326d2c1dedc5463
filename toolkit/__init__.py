"""toolkit: versioned codemods that make installed vLLM and SGLang engines do what RL and
interpretability work needs, without a fork.

``import toolkit`` is cheap (no libcst, no torch): patched engines import this package's runtime
modules in every process, so the public API below loads on first use.
"""

from __future__ import annotations

TYPE_CHECKING = False  # not typing's: the command line starts here, and a Ctrl-C before its handler is a traceback

from toolkit.base.lazy import lazy_attributes
from toolkit.base.version import __version__

if TYPE_CHECKING:
    from toolkit.api import apply_patch, patch_status, revert_patch
    from toolkit.errors import PatchError

__all__ = ["__version__", "apply_patch", "revert_patch", "patch_status", "PatchError"]

_LAZY = {"apply_patch": "toolkit.api", "revert_patch": "toolkit.api", "patch_status": "toolkit.api",
         "PatchError": "toolkit.errors"}


__getattr__ = lazy_attributes(__name__, _LAZY, globals())
