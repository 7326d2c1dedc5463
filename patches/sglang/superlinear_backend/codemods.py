"""The superlinear-backend edits for SGLang 0.5.9, one transformer per file; the backend is in
``toolkit.patches.sglang.superlinear`` (shared with the 0.5.23 plugin).

attention_registry.py: ``superlinear`` registered next to the built-in backends.
server_args.py: ``superlinear`` added to ``ATTENTION_BACKEND_CHOICES`` (the CLI's choices).
utils/common.py: ``support_triton("superlinear")`` is False, as for ``torch_native``: the batch set-up
then uses its PyTorch helpers instead of Triton kernels (needed on CPU).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer

RUNTIME = "_toolkit_superlinear"
RUNTIME_IMPORT = f"from toolkit.patches.sglang.superlinear_backend import runtime as {RUNTIME}"
NAME = "superlinear"


def _top_level_def(name: str) -> m.FunctionDef:
    return m.FunctionDef(name=m.Name(name))


class RegistryTransformer(AnchoredTransformer):
    """srt/layers/attention/attention_registry.py."""

    ANCHORS = {
        "runtime-import": "the module's first import (ours goes after it)",
        "register_attention_backend": "def register_attention_backend at module level (ours is registered after it)",
    }

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body: list[cst.BaseStatement] = []
        for statement in updated_node.body:
            body.append(statement)
            if m.matches(statement, _top_level_def("register_attention_backend")):
                self.hit("register_attention_backend")
                body.append(self.marked_statement(f"register_attention_backend({RUNTIME}.NAME)({RUNTIME}.create)"))
        module = updated_node.with_changes(body=body)
        return self.insert_after_first_import(module, RUNTIME_IMPORT, "runtime-import")


class ChoicesTransformer(AnchoredTransformer):
    """srt/server_args.py."""

    ANCHORS = {"ATTENTION_BACKEND_CHOICES": "the module-level ATTENTION_BACKEND_CHOICES = [...] list"}

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        choices = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name("ATTENTION_BACKEND_CHOICES"))],
                                                       value=m.List())])
        body: list[cst.BaseStatement] = []
        for statement in updated_node.body:
            body.append(statement)
            if m.matches(statement, choices):
                self.hit("ATTENTION_BACKEND_CHOICES")
                body.append(self.marked_statement(f'ATTENTION_BACKEND_CHOICES.append("{NAME}")'))
        return updated_node.with_changes(body=body)


class SupportTritonTransformer(AnchoredTransformer):
    """srt/utils/common.py."""

    ANCHORS = {"support_triton": "def support_triton(backend) at module level"}

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if not m.matches(updated_node, m.FunctionDef(name=m.Name("support_triton"),
                                                     params=m.Parameters(params=[m.Param(name=m.Name())]))):
            return updated_node
        self.hit("support_triton")
        arg = updated_node.params.params[0].name.value
        guard = self.marked_statement(f'if {arg} == "{NAME}": return False')
        body = updated_node.body
        return updated_node.with_changes(body=body.with_changes(body=[guard, *body.body]))
