"""The edit, on ``vllm/parser/qwen3.py``.

vLLM 0.24's parser engine converts a qwen3_coder tool call's ``<parameter=...>`` values with
``value.strip()``, where vLLM 0.23's ``Qwen3CoderToolParser`` trimmed exactly one leading and one
trailing newline (the chat template's markup). A full strip corrupts whitespace-significant
arguments (``old_str``/``new_str`` of str_replace tools, file content with an indented first line),
silently changing what an agent's tool does. prime-rl replaces the whole converter with a copy; here
each ``value.strip()`` of ``_qwen3_arg_converter`` becomes ``_trim_wrapping_newlines(value)``, and
that helper is added above the converter (vLLM 0.26's own fix, under the same name)::

    def _trim_wrapping_newlines(value: str) -> str:  # toolkit:qwen3-coder-param-newline-trim
        if value.startswith("\\n"):
            value = value[1:]
        if value.endswith("\\n"):
            value = value[:-1]
        return value

Anchors: the module-level ``_qwen3_arg_converter``, and at least one ``value.strip()`` in it (vLLM
0.26 has none: the fix is upstream, ``not_needed``).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import MODULE, AnchoredTransformer

CONVERTER = "_qwen3_arg_converter"
HELPER = "_trim_wrapping_newlines"

STRIP = m.Call(func=m.Attribute(value=m.Name("value"), attr=m.Name("strip")), args=[])

TRIM = f'''\
def {HELPER}(value: str) -> str:
    """Strip one leading and one trailing newline (the Qwen3 template markup)."""
    if value.startswith("\\n"):
        value = value[1:]
    if value.endswith("\\n"):
        value = value[:-1]
    return value
'''


class Qwen3ParserTransformer(AnchoredTransformer):
    INSIDE = {MODULE: frozenset({CONVERTER})}
    MULTI_ANCHORS = frozenset({"strip"})
    ANCHORS = {
        "converter": f"the module-level `def {CONVERTER}(...)`",
        "strip": f"`value.strip()` in {CONVERTER}",
    }

    @m.leave(STRIP)
    @m.call_if_inside(m.FunctionDef(name=m.Name(CONVERTER)))
    def trim_one_newline(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        self.hit("strip")
        self.mark_this_statement()
        return cst.parse_expression(f"{HELPER}(value)")

    @m.leave(m.Module())
    def add_the_helper(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = list(updated_node.body)
        found = [i for i, statement in enumerate(body) if m.matches(statement, m.FunctionDef(name=m.Name(CONVERTER)))]
        if len(found) != 1:
            return updated_node
        self.hit("converter")
        (at,) = found
        helper = self.marked_statement(TRIM).with_changes(leading_lines=body[at].leading_lines)
        body[at] = body[at].with_changes(leading_lines=[cst.EmptyLine(), cst.EmptyLine()])
        body.insert(at, helper)
        return updated_node.with_changes(body=body)
