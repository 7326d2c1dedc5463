"""A deliberately broken SGLang codemod, outside the registry: the test of scripts/engine_own_tests.py for
SGLang (issue 50).

    python scripts/engine_own_tests.py sglang==0.5.23 \
        --extra-patch scripts/support/broken_sglang_patch.py:PATCH          # must exit 1

It turns ``ChatCompletionRequest.return_prompt_token_ids`` (protocol.py, the file the token-ids and tito
patches edit) on by default: every chat response would carry its prompt's token ids, and SGLang's own
test of the default (test_return_token_ids.py) fails patched while it passes on the release. Never
registered: it is loaded only by ``--extra-patch``."""
from __future__ import annotations

import libcst as cst

from toolkit.declare import FileEdit, Patch


class DefaultPromptTokenIdsOn(cst.CSTTransformer):
    """``return_prompt_token_ids: bool = False`` in class ChatCompletionRequest -> ``= True``."""

    def __init__(self, context):
        super().__init__()
        self.inside = False

    def anchor_report(self):  # the patch engine asks every transformer; this one declares no anchors
        return []

    def visit_ClassDef(self, node):
        if node.name.value == "ChatCompletionRequest":
            self.inside = True

    def leave_ClassDef(self, original_node, updated_node):
        if original_node.name.value == "ChatCompletionRequest":
            self.inside = False
        return updated_node

    def leave_AnnAssign(self, original_node, updated_node):
        target = updated_node.target
        if self.inside and isinstance(target, cst.Name) and target.value == "return_prompt_token_ids":
            return updated_node.with_changes(value=cst.Name("True"))
        return updated_node


PATCH = Patch(id="broken-prompt-token-ids", engine="sglang", versions=">=0.5.10,<0.6",
              files=(FileEdit("srt/entrypoints/openai/protocol.py", (DefaultPromptTokenIdsOn,)),),
              summary="deliberately broken: every chat request asks for its prompt's token ids",
              after=("token-ids", "tito"))  # both edit protocol.py
