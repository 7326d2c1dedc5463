"""Test helpers for patch authors: golden snippets and conformance on real engine releases.

Kit API v1 at its public path (docs/kit-reference.md); the code is in :mod:`toolkit.kit._testing`.
"""

from toolkit.kit._testing import (anchor_problems, assert_codemod, assert_conforms, composition_problems,
                                  conformance_problems, copy_files, digests, golden_problems)

__all__ = ["assert_codemod", "assert_conforms", "conformance_problems", "golden_problems", "anchor_problems",
           "composition_problems", "copy_files", "digests"]
