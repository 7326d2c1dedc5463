"""The superlinear-backend edits for SGLang 0.5.9 and 0.5.10, one transformer per file; the backend is in
``toolkit.patches.sglang.superlinear`` (shared with the plugin of 0.5.11 on).

attention_registry.py: ``superlinear`` registered next to the built-in backends.
server_args.py: ``superlinear`` added to ``ATTENTION_BACKEND_CHOICES`` (the CLI's choices).
utils/common.py: ``support_triton("superlinear")`` is False, as for ``torch_native``: the batch set-up
then uses its PyTorch helpers instead of Triton kernels (needed on CPU).
"""

from __future__ import annotations

from typing import ClassVar

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer

RUNTIME = "_toolkit_superlinear"
NAME = "superlinear"

CHOICES = m.SimpleStatementLine(body=[m.Assign(
    targets=[m.AssignTarget(target=m.Name("ATTENTION_BACKEND_CHOICES"))], value=m.List())])


class RegistryTransformer(AnchoredTransformer):
    """srt/layers/attention/attention_registry.py."""

    RUNTIME, RUNTIME_ALIAS = "toolkit.patches.sglang.superlinear_backend", RUNTIME
    INSIDE: ClassVar[dict[str, frozenset[str]]] = {}  # module level only
    ANCHORS = {
        "register_attention_backend": "def register_attention_backend at module level (ours is registered after it)",
    }

    @m.leave(m.Module())
    def register_after_the_factory(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body: list[cst.BaseStatement] = []
        for statement in updated_node.body:
            body.append(statement)
            if m.matches(statement, m.FunctionDef(name=m.Name("register_attention_backend"))):
                self.hit("register_attention_backend")
                body.append(self.marked_statement(f"register_attention_backend({RUNTIME}.NAME)({RUNTIME}.create)"))
        return updated_node.with_changes(body=body)


class ChoicesTransformer(AnchoredTransformer):
    """srt/server_args.py."""

    INSIDE: ClassVar[dict[str, frozenset[str]]] = {}  # module level only
    ANCHORS = {"ATTENTION_BACKEND_CHOICES": "the module-level ATTENTION_BACKEND_CHOICES = [...] list"}

    @m.leave(m.Module())
    def add_the_choice(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = self.around_each(updated_node.body, CHOICES, "ATTENTION_BACKEND_CHOICES",
                                [self.marked_statement(f'ATTENTION_BACKEND_CHOICES.append("{NAME}")')])
        return updated_node.with_changes(body=body)


class SupportTritonTransformer(AnchoredTransformer):
    """srt/utils/common.py."""

    INSIDE: ClassVar[dict[str, frozenset[str]]] = {}  # module level only (the edit takes the function whole)
    ANCHORS = {"support_triton": "def support_triton(backend) at module level"}

    @m.leave(m.FunctionDef(name=m.Name("support_triton"), params=m.Parameters(params=[m.Param(name=m.Name())])))
    def not_for_superlinear(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self.hit("support_triton")
        arg = updated_node.params.params[0].name.value
        guard = self.marked_statement(f'if {arg} == "{NAME}": return False')
        body = updated_node.body
        return updated_node.with_changes(body=body.with_changes(body=[guard, *body.body]))
