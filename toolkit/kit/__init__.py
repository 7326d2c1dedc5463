"""The patch authors' kit in one package: kit API v1 behind one ``__all__``, as libcst's ``codemod`` package
holds its commands. ``from toolkit.kit import Patch, AnchoredTransformer, assert_conforms`` reads the same
objects as the public paths ``toolkit.declare``, ``toolkit.codemod``, ``toolkit.testing``, ``toolkit.releases``
and ``toolkit.matrix``, each a face over one private module here (``_declare``, ``_codemod``, ...). The rest
of the folder is the kit's commands' code (``toolkit new-patch``, ``toolkit audit``, ``toolkit own-tests``).

Nothing loads at import: a patch's declaration (``toolkit.declare``) is read in every engine process and by
``toolkit list``, and must not drag libcst in; a name loads its module on first use.
"""

from __future__ import annotations

from toolkit.base.lazy import lazy_attributes

TYPE_CHECKING = False
if TYPE_CHECKING:
    from toolkit.kit._codemod import (MODULE, AnchoredTransformer, after_last_field, class_named, has_params, in_method,
                                      is_field, self_call, with_body)
    from toolkit.kit._declare import KIT_VERSION, FileEdit, Patch, PatchContext
    from toolkit.kit._matrix import Cell, choose_releases, evaluate, problems, run
    from toolkit.kit._releases import KNOWN_RELEASES, release_tree, releases_of
    from toolkit.kit._testing import (anchor_problems, assert_codemod, assert_conforms, composition_problems,
                                      conformance_problems, copy_files, digests, golden_problems)

# One `__all__`, face by face; each part's names load from that face's private module on first use.
_LAZY: dict[str, str] = {}
__all__ = ["Patch", "FileEdit", "PatchContext", "KIT_VERSION"]
_LAZY |= dict.fromkeys(__all__[len(_LAZY):], "toolkit.kit._declare")
__all__ += ["AnchoredTransformer", "class_named", "in_method", "self_call", "has_params", "is_field", "after_last_field",
            "with_body", "MODULE"]  # toolkit.codemod lists the declarations too
_LAZY |= dict.fromkeys(__all__[len(_LAZY):], "toolkit.kit._codemod")
__all__ += ["assert_codemod", "assert_conforms", "conformance_problems", "golden_problems", "anchor_problems",
            "composition_problems", "copy_files", "digests"]
_LAZY |= dict.fromkeys(__all__[len(_LAZY):], "toolkit.kit._testing")
__all__ += ["KNOWN_RELEASES", "releases_of", "release_tree"]
_LAZY |= dict.fromkeys(__all__[len(_LAZY):], "toolkit.kit._releases")
__all__ += ["Cell", "choose_releases", "evaluate", "run", "problems"]
_LAZY |= dict.fromkeys(__all__[len(_LAZY):], "toolkit.kit._matrix")

__getattr__ = lazy_attributes(__name__, _LAZY, globals())
