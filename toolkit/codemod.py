"""The codemod base: the libcst transformer every patch edit builds on (declarations: ``toolkit.declare``).

Kit API v1 at its public path (docs/kit-reference.md); the code is in :mod:`toolkit.kit._codemod`.
"""

from toolkit.kit._codemod import (MODULE, AnchoredTransformer, after_last_field, class_named, has_params, in_method,
                                  is_field, self_call, with_body)
from toolkit.kit._declare import FileEdit, Patch, PatchContext

__all__ = ["AnchoredTransformer", "class_named", "in_method", "self_call", "has_params", "is_field", "after_last_field",
           "with_body", "MODULE", "FileEdit", "Patch", "PatchContext"]
