"""What a patch declares: an id, an engine, supported versions, the files it edits and, for each, the
transformers that edit it. No libcst here: ``toolkit list``, ``status`` and an apply with nothing to do
read declarations without loading any codemod.

Kit API v1 at its public path (docs/kit-reference.md); the code is in :mod:`toolkit.kit._declare`.
"""

from toolkit.kit._declare import Patch, FileEdit, PatchContext, KIT_VERSION

__all__ = ["Patch", "FileEdit", "PatchContext", "KIT_VERSION"]
