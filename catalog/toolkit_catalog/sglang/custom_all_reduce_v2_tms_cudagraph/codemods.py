"""The edit, on ``sglang/srt/distributed/device_communicators/custom_all_reduce_v2.py``.

With ``SGLANG_MEMORY_SAVER_CUDA_GRAPH=true`` (torch_memory_saver pausing the CUDA graphs of an engine
colocated with training), the memory saver replaces the IPC addresses during capture: addresses
custom all-reduce v2 registers while its capture flag is on are stale at replay, and
``custom_all_reduce.cuh`` can fail. sglang#27948 keeps the flag off in that mode; NeMo-RL backports it
with four string replacements. Structurally:

- ``from sglang.srt.environ import envs`` before the module's ``from sglang.srt.utils import ...``;
- ``self.tms_cudagraph = envs.SGLANG_MEMORY_SAVER_CUDA_GRAPH.get()`` after
  ``self.override_algo: Optional[AllReduceAlgo] = None`` in ``CustomAllReduceV2.__init__``;
- each ``self.obj.set_cuda_graph_capture(True)`` of the class becomes
  ``self.obj.set_cuda_graph_capture(not self.tms_cudagraph)`` (``capture`` and the piecewise-graph
  branch of ``custom_all_reduce``).

NeMo-RL's first anchor is ``from sglang.srt.utils import is_sm100_supported, log_info_on_rank0``
verbatim: SGLang 0.5.14 imports ``is_sm100_supported`` alone there, and their patch raises; this
edit anchors on the import's module.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer

CLASS = "CustomAllReduceV2"

SGLANG_UTILS = m.Attribute(value=m.Attribute(value=m.Name("sglang"), attr=m.Name("srt")), attr=m.Name("utils"))
IMPORTS_UTILS = m.SimpleStatementLine(body=[m.ImportFrom(module=SGLANG_UTILS)])
OVERRIDE_ALGO = m.SimpleStatementLine(body=[m.AnnAssign(
    target=m.Attribute(value=m.Name("self"), attr=m.Name("override_algo")), value=m.Name("None"))])
CAPTURE_ON = m.Call(func=m.Attribute(value=m.Attribute(value=m.Name("self"), attr=m.Name("obj")),
                                     attr=m.Name("set_cuda_graph_capture")),
                    args=[m.Arg(value=m.Name("True"))])


class CustomAllReduceV2Transformer(AnchoredTransformer):
    INSIDE = {CLASS: frozenset({"__init__", "capture", "custom_all_reduce"})}
    MULTI_ANCHORS = frozenset({"capture-flag"})
    ANCHORS = {
        "import": "the module-level `from sglang.srt.utils import ...`",
        "override-algo": f"`self.override_algo: Optional[AllReduceAlgo] = None` in {CLASS}.__init__",
        "capture-flag": f"`self.obj.set_cuda_graph_capture(True)` in {CLASS}",
    }

    @m.leave(m.Module())
    def import_envs(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = list(updated_node.body)
        found = [i for i, statement in enumerate(body) if m.matches(statement, IMPORTS_UTILS)]
        if len(found) != 1:
            return updated_node
        self.hit("import")
        (at,) = found
        body.insert(at, self.marked_statement("from sglang.srt.environ import envs").with_changes(
            leading_lines=body[at].leading_lines))
        body[at + 1] = body[at + 1].with_changes(leading_lines=[])
        return updated_node.with_changes(body=body)

    @m.leave(m.FunctionDef(name=m.Name("__init__")))
    @m.call_if_inside(m.ClassDef(name=m.Name(CLASS)))
    def read_the_setting(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        body = list(updated_node.body.body)
        found = [i for i, statement in enumerate(body) if m.matches(statement, OVERRIDE_ALGO)]
        if len(found) != 1:
            return updated_node
        self.hit("override-algo")
        body.insert(found[0] + 1, self.marked_statement("self.tms_cudagraph = envs.SGLANG_MEMORY_SAVER_CUDA_GRAPH.get()"))
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))

    @m.leave(CAPTURE_ON)
    @m.call_if_inside(m.ClassDef(name=m.Name(CLASS)))
    def flag_off_under_the_memory_saver(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        self.hit("capture-flag")
        self.mark_this_statement()
        return updated_node.with_changes(args=[cst.Arg(cst.parse_expression("not self.tms_cudagraph"))])
