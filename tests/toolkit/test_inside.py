"""What ``AnchoredTransformer.INSIDE`` limits, as docs/writing-patches.md says (issue 58): a class not
named is skipped whole; a function (method or module-level) is visited when its name is in one of the
sets (pooled: a name listed under ``MODULE`` opens that method in every named class) or when it sits in a
visited function; module-level statements and a named class's own statements are always visited."""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import MODULE, AnchoredTransformer
from toolkit.declare import PatchContext

SOURCE = '''
X = call()
if flag:
    Y = call()
def helper():
    Z = call()
def listed():
    W = call()
    def inner():
        V = call()
class Other:
    A = call()
    def listed(self):
        B = call()
class Engine:
    C = call()
    def step(self):
        D = call()
    def listed(self):
        E = call()
    def unlisted(self):
        F = call()
'''


class Recorder(AnchoredTransformer):
    INSIDE = {"Engine": frozenset({"step"}), MODULE: frozenset({"listed"})}

    def __init__(self, context: PatchContext) -> None:
        super().__init__(context)
        self.seen: list[str] = []
        self.left_module = False

    @m.visit(m.Assign())
    def record(self, node: cst.Assign) -> None:
        self.seen.append(node.targets[0].target.value)  # type: ignore[attr-defined]

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        self.left_module = True
        return super().leave_Module(original_node, updated_node)


def test_inside_limits_classes_and_functions_not_module_level_statements():
    recorder = Recorder(PatchContext("example", "vllm", "0.33.0", "module.py"))
    cst.parse_module(SOURCE).visit(recorder)
    assert recorder.seen == ["X", "Y", "W", "V", "C", "D", "E"]
    assert recorder.left_module  # leave_Module (where the runtime import goes) runs whatever INSIDE says
