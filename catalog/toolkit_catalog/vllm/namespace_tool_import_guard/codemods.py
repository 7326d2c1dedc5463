"""The edit, on ``vllm/tool_parsers/utils.py``.

vLLM 0.25 imports ``openai.types.responses.NamespaceTool`` (openai >= 2.25.0) at the top of the tool
parsers' utilities. An environment pinned to an older openai (NeMo-RL's nemo-gym servers pin
``openai<=2.7.2``) cannot import vLLM's tool parsing at all. ``NamespaceTool`` is used only in
``isinstance`` checks of Responses-API namespace tools, which a client that old cannot build, so a
stub no object is an instance of is a faithful fallback. NeMo-RL's fix, structurally::

    from openai.types.responses import (
        FunctionTool,
        ToolChoiceFunction,
    )  # toolkit:namespace-tool-import-guard

    try:  # toolkit:namespace-tool-import-guard
        from openai.types.responses import NamespaceTool
    except ImportError:  # openai < 2.25.0 predates namespace tools
        class NamespaceTool:  # type: ignore[no-redef]
            ...  (a docstring: the stub has no members)

The import is matched by its module and the name, not its exact text: vLLM 0.32 added
``CustomTool`` and ``ToolChoiceCustom`` to it, where NeMo-RL's snippet no longer matches and its
patch logs a warning and does nothing. The other names stay in the release's import.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import MODULE, AnchoredTransformer

RESPONSES = m.Attribute(value=m.Attribute(value=m.Name("openai"), attr=m.Name("types")), attr=m.Name("responses"))
NAMESPACE_TOOL = m.ImportAlias(name=m.Name("NamespaceTool"), asname=None)
IMPORTS_IT = m.SimpleStatementLine(body=[m.ImportFrom(module=RESPONSES,
                                                      names=[m.ZeroOrMore(), NAMESPACE_TOOL, m.ZeroOrMore()])])

GUARD = '''\
try:
    from openai.types.responses import NamespaceTool
except ImportError:  # openai < 2.25.0 predates namespace tools

    class NamespaceTool:  # type: ignore[no-redef]
        """Stub: openai<2.25 clients cannot construct namespace tools."""
'''


class ToolParserUtilsTransformer(AnchoredTransformer):
    INSIDE = {MODULE: frozenset()}  # module-level statements only: no class or function is visited
    ANCHORS = {"import": "the module-level `from openai.types.responses import (..., NamespaceTool, ...)`"}

    @m.leave(m.Module())
    def guard_the_import(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = list(updated_node.body)
        found = [i for i, statement in enumerate(body) if m.matches(statement, IMPORTS_IT)]
        if len(found) != 1:
            return updated_node  # none or two: the anchor report names it and nothing is written
        self.hit("import")
        (at,) = found
        line = body[at]
        assert isinstance(line, cst.SimpleStatementLine)
        (imported,) = line.body
        assert isinstance(imported, cst.ImportFrom) and not isinstance(imported.names, cst.ImportStar)
        others = [alias for alias in imported.names if not m.matches(alias, NAMESPACE_TOOL)]
        guard = self.marked_statement(GUARD)
        if not others:  # NamespaceTool was the only name: the guard is the whole import
            body[at] = guard.with_changes(leading_lines=line.leading_lines)
        else:
            if imported.rpar is None:  # `from x import A, NamespaceTool`: no trailing comma without parentheses
                others[-1] = others[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
            kept = self.marked_line(line.with_changes(body=[imported.with_changes(names=others)]))
            body[at:at + 1] = [kept, guard.with_changes(leading_lines=[cst.EmptyLine()])]
        return updated_node.with_changes(body=body)
