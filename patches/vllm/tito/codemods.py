"""The tito edits, one transformer per vLLM file; the logic they call is in ``runtime.py``.

protocol.py: ``input_ids`` and ``logprob_start_len`` fields on ``ChatCompletionRequest`` plus a
"before" validator that calls the runtime; ``token_id`` on ``ChatCompletionLogProb`` (and so on its
subclass ``ChatCompletionLogProbsContent``).

renderers/online_renderer.py: ``_reused_prompt_token_ids`` (vLLM's path for a prompt that arrives
already tokenized) returns ``input_ids`` first, so the ids reach the engine without a template while
tool-choice checks and the parser's ``adjust_request`` still run, for chat and Harmony alike.

serving.py: the rendered prompt is checked (length, ``logprob_start_len``), logprob entries get
their ids, and prompt logprobs before ``logprob_start_len`` are dropped.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer

RUNTIME = "_toolkit_tito"
RUNTIME_IMPORT = f"from toolkit.patches.vllm.tito import runtime as {RUNTIME}"


class _TitoTransformer(AnchoredTransformer):
    """The runtime import (after the module's first import), scope tracking and marked edits."""

    def __init__(self, context) -> None:
        super().__init__(context)
        self._scope: list[str] = []  # enclosing class and function names, outermost first

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return self.insert_after_first_import(updated_node, RUNTIME_IMPORT, "runtime-import")

    # scope
    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._scope.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.BaseStatement:
        self._scope.pop()
        return self.edit_class(original_node.name.value, updated_node)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scope.append(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.BaseStatement:
        self._scope.pop()
        return self.edit_function(original_node.name.value, updated_node)

    def edit_class(self, name: str, node: cst.ClassDef) -> cst.BaseStatement:
        return node

    def edit_function(self, name: str, node: cst.FunctionDef) -> cst.BaseStatement:
        return node

    # marked code
    def _marked_line(self, line: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        trailing = line.trailing_whitespace
        comment = self.marker if trailing.comment is None else f"{self.marker}  {trailing.comment.value}"
        return line.with_changes(
            trailing_whitespace=trailing.with_changes(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(comment))
        )


def _is_field(statement: cst.BaseStatement, name: str | None = None) -> bool:
    target = m.Name(name) if name else m.Name()
    return m.matches(statement, m.SimpleStatementLine(body=[m.AnnAssign(target=target)]))


def _after_last_field(body: Sequence[cst.BaseStatement], new: Sequence[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """``new`` after the class's last field that comes before its first method."""
    methods = [position for position, item in enumerate(body) if isinstance(item, cst.FunctionDef)]
    head = body[: methods[0]] if methods else body
    fields = [position for position, item in enumerate(head) if _is_field(item)]
    position = fields[-1] + 1 if fields else 0
    return [*body[:position], *new, *body[position:]]


def _with_body(node: cst.ClassDef | cst.FunctionDef, body: Sequence[cst.BaseStatement]):
    return node.with_changes(body=node.body.with_changes(body=list(body)))


# --------------------------------------------------------------------------------------------------
# vllm/entrypoints/openai/chat_completion/protocol.py

REQUEST_FIELDS = '''
input_ids: list[int] | None = Field(
    default=None,
    description=(
        "Token ids to use as the prompt, exactly: no chat template, no tokenization. "
        "`messages` may still be sent (tool and reasoning parsing) but never changes the prompt."
    ),
)
logprob_start_len: int | None = Field(
    default=None,
    description=(
        "Return prompt logprobs from this prompt position on (-1: none). Such a request skips "
        "reading the prefix cache."
    ),
)
'''

REQUEST_VALIDATOR = '''
@model_validator(mode="before")
@classmethod
def _toolkit_tito_request(cls, data):
    return {runtime}.normalize_request(data)
'''


class ProtocolTransformer(_TitoTransformer):
    ANCHORS = {
        "runtime-import": "the module's first import (the runtime import goes after it)",
        "ChatCompletionLogProb": "class ChatCompletionLogProb (gets a token_id field)",
        "ChatCompletionRequest": "class ChatCompletionRequest (gets input_ids, logprob_start_len and a validator)",
    }

    def edit_class(self, name: str, node: cst.ClassDef) -> cst.BaseStatement:
        if self._scope:  # module-level classes only
            return node
        body = list(node.body.body)
        if name == "ChatCompletionLogProb":
            self.hit("ChatCompletionLogProb")
            return _with_body(node, _after_last_field(body, [self.marked_statement("token_id: int | None = None")]))
        if name == "ChatCompletionRequest":
            self.hit("ChatCompletionRequest")
            fields = [self._mark_all(s) for s in cst.parse_module(REQUEST_FIELDS.lstrip()).body]
            validator = cst.parse_module(REQUEST_VALIDATOR.format(runtime=RUNTIME).lstrip()).body[0]
            assert isinstance(validator, cst.FunctionDef)
            validator = validator.with_changes(
                leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(comment=cst.Comment(self.marker))]
            )
            return _with_body(node, [*_after_last_field(body, fields), validator])
        return node

    def _mark_all(self, statement: cst.BaseStatement) -> cst.BaseStatement:
        if isinstance(statement, cst.SimpleStatementLine):
            return self._marked_line(statement)
        return statement


# --------------------------------------------------------------------------------------------------
# vllm/renderers/online_renderer.py


class OnlineRendererTransformer(_TitoTransformer):
    ANCHORS = {
        "runtime-import": "the module's first import (the runtime import goes after it)",
        "_reused_prompt_token_ids": "module function _reused_prompt_token_ids(request, renderer, ...)",
    }

    def edit_function(self, name: str, node: cst.FunctionDef) -> cst.BaseStatement:
        if self._scope or name != "_reused_prompt_token_ids":
            return node
        params = [p.name.value for p in node.params.params]
        if params[:2] != ["request", "renderer"]:
            return node  # a changed signature is a missing anchor, reported by name
        self.hit("_reused_prompt_token_ids")
        body = list(node.body.body)
        position = 1 if body and m.matches(body[0], m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])) else 0
        new = [
            self.marked_statement(f"toolkit_ids = {RUNTIME}.prompt_ids_from_request(request, renderer)"),
            cst.parse_statement(f"if toolkit_ids is not None:  {self.marker}\n    return toolkit_ids\n"),
        ]
        return _with_body(node, [*body[:position], *new, *body[position:]])


# --------------------------------------------------------------------------------------------------
# vllm/entrypoints/openai/chat_completion/serving.py


class ServingTransformer(_TitoTransformer):
    ANCHORS = {
        "runtime-import": "the module's first import (the runtime import goes after it)",
        "rendered-prompt": "`conversation, engine_inputs = ...` in OpenAIServingChat._create_chat_completion",
        "logprobs-return": "`return ChatCompletionLogProbs(...)` in OpenAIServingChat._create_chat_logprobs",
        "prompt-logprobs": "the prompt_logprobs= argument of ChatCompletionResponse(...) in "
        "OpenAIServingChat.chat_completion_full_generator",
    }

    RENDERED = m.SimpleStatementLine(
        body=[m.Assign(targets=[m.AssignTarget(target=m.Tuple(elements=[m.ZeroOrMore(), m.Element(m.Name("engine_inputs"))]))])]
    )

    def _in_method(self, name: str) -> bool:
        return len(self._scope) >= 2 and self._scope[-1] == name and self._scope[-2] == "OpenAIServingChat"

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        if not self._in_method("_create_chat_completion"):
            return updated_node
        body: list[cst.BaseStatement] = []
        for statement in updated_node.body:
            body.append(statement)
            if m.matches(statement, self.RENDERED):
                self.hit("rendered-prompt")
                body.append(
                    self.marked_statement(
                        f"{RUNTIME}.check_prompt(request, engine_inputs, self.model_config.max_model_len)"
                    )
                )
        return updated_node.with_changes(body=body)

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        if not self._in_method("_create_chat_logprobs"):
            return updated_node
        if not m.matches(updated_node, m.SimpleStatementLine(body=[m.Return(value=m.Call(func=m.Name("ChatCompletionLogProbs")))])):
            return updated_node
        self.hit("logprobs-return")
        ret = updated_node.body[0]
        assert isinstance(ret, cst.Return) and ret.value is not None
        wrapped = cst.parse_expression(f"{RUNTIME}.with_logprob_token_ids(VALUE, token_ids, top_logprobs)")
        assert isinstance(wrapped, cst.Call)
        wrapped = wrapped.with_changes(args=[wrapped.args[0].with_changes(value=ret.value), *wrapped.args[1:]])
        return self._marked_line(updated_node.with_changes(body=[ret.with_changes(value=wrapped)]))

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if not self._in_method("chat_completion_full_generator"):
            return updated_node
        if not m.matches(updated_node, m.Call(func=m.Name("ChatCompletionResponse"))):
            return updated_node
        args = []
        for arg in updated_node.args:
            if m.matches(arg, m.Arg(keyword=m.Name("prompt_logprobs"))):
                self.hit("prompt-logprobs")
                value = cst.parse_expression(f"{RUNTIME}.prompt_logprobs_from(request, VALUE)")
                assert isinstance(value, cst.Call)
                value = value.with_changes(args=[value.args[0], value.args[1].with_changes(value=arg.value)])
                arg = arg.with_changes(value=value, comma=self._marked_comma(arg.comma))
            args.append(arg)
        return updated_node.with_changes(args=args)

    def _marked_comma(self, comma: cst.Comma | cst.MaybeSentinel) -> cst.Comma | cst.MaybeSentinel:
        """A comment on the line the argument ends (when the call spans lines)."""
        if isinstance(comma, cst.Comma) and isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace):
            after = comma.whitespace_after
            first = after.first_line.with_changes(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(self.marker))
            return comma.with_changes(whitespace_after=after.with_changes(first_line=first))
        return comma
