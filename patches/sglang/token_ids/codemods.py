"""The token-ids edits, one transformer per SGLang file; the logic they call is in ``runtime.py``.

protocol.py: ``return_token_ids`` on the chat request (0.5.23 has it already), ``prompt_token_ids``
on the response and ``token_ids`` on its choices, left out of the JSON when None.

serving_chat.py: the chat stream generator is wrapped and its engine outputs tapped (streaming);
the built non-streaming response gets its ids; 0.5.23's rejection of ``return_token_ids`` on stream
requests goes.
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst
import libcst.matchers as m
from packaging.version import Version

from toolkit.codemod import AnchoredTransformer, PatchContext

RUNTIME = "_toolkit_token_ids"
RUNTIME_IMPORT = f"from toolkit.patches.sglang.token_ids import runtime as {RUNTIME}"


class _TokenIdsTransformer(AnchoredTransformer):
    """The runtime import, and helpers for marked edits."""

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return self.insert_after_first_import(updated_node, RUNTIME_IMPORT, "runtime-import")

    def _comment(self, existing: cst.Comment | None) -> cst.Comment:
        return cst.Comment(self.marker if existing is None else f"{self.marker}  {existing.value}")

    def _marked_line(self, line: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        trailing = line.trailing_whitespace
        return line.with_changes(
            trailing_whitespace=trailing.with_changes(
                whitespace=cst.SimpleWhitespace("  "), comment=self._comment(trailing.comment)
            )
        )

    def _decorator(self, code: str) -> cst.Decorator:
        return cst.Decorator(
            decorator=cst.parse_expression(code),
            trailing_whitespace=cst.TrailingWhitespace(
                whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(self.marker)
            ),
        )


def _is_field(statement: cst.BaseStatement, name: str | None = None) -> bool:
    target = m.Name(name) if name else m.Name()
    return m.matches(statement, m.SimpleStatementLine(body=[m.AnnAssign(target=target)]))


def _after_last_field(body: Sequence[cst.BaseStatement], statement: cst.BaseStatement) -> list[cst.BaseStatement]:
    fields = [position for position, item in enumerate(body) if _is_field(item)]
    position = fields[-1] + 1 if fields else 0
    return [*body[:position], statement, *body[position:]]


WRAP_SERIALIZER = m.Decorator(
    decorator=m.Call(
        func=m.Name("model_serializer"),
        args=[
            m.ZeroOrMore(),
            m.Arg(keyword=m.Name("mode"), value=m.SimpleString('"wrap"') | m.SimpleString("'wrap'")),
            m.ZeroOrMore(),
        ],
    )
)


class ProtocolTransformer(_TokenIdsTransformer):
    """srt/entrypoints/openai/protocol.py: the request flag and the response fields."""

    ANCHORS = {
        "runtime-import": "the module's first import (ours goes after it)",
        "ChatCompletionRequest": "class ChatCompletionRequest (return_token_ids added unless present)",
        "ChatCompletionResponse.serializer": 'ChatCompletionResponse\'s model_serializer(mode="wrap")',
        "ChatCompletionResponseChoice.serializer": 'ChatCompletionResponseChoice\'s model_serializer(mode="wrap")',
    }
    # class -> the field it gets, left out of the JSON when None
    RESPONSE_FIELDS = {
        "ChatCompletionResponse": "prompt_token_ids",
        "ChatCompletionResponseChoice": "token_ids",
    }

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        name = updated_node.name.value
        body = list(updated_node.body.body)
        if name == "ChatCompletionRequest":
            self.hit("ChatCompletionRequest")
            if not any(_is_field(statement, "return_token_ids") for statement in body):
                body = _after_last_field(body, self.marked_statement("return_token_ids: bool = False"))
        elif name in self.RESPONSE_FIELDS:
            field = self.RESPONSE_FIELDS[name]
            found = False
            for position, statement in enumerate(body):
                if isinstance(statement, cst.FunctionDef) and any(
                    m.matches(decorator, WRAP_SERIALIZER) for decorator in statement.decorators
                ):
                    self.hit(f"{name}.serializer")
                    body[position] = self._omit_when_none(statement, field)
                    found = True
            if found:
                body = _after_last_field(body, self.marked_statement(f"{field}: list[int] | None = None"))
        else:
            return updated_node
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))

    def _omit_when_none(self, serializer: cst.FunctionDef, field: str) -> cst.FunctionDef:
        """Our decorator right under pydantic's, so pydantic wraps the serializer that drops the field."""
        decorators = list(serializer.decorators)
        position = next(i for i, decorator in enumerate(decorators) if m.matches(decorator, WRAP_SERIALIZER))
        decorators.insert(position + 1, self._decorator(f'{RUNTIME}.omit_when_none("{field}")'))
        return serializer.with_changes(decorators=decorators)


def _self_call(*names: str) -> m.Call:
    """Matches a call of ``self.<names[0]>.<names[1]>...(...)``."""
    func: m.BaseExpression = m.Name("self")
    for name in names:
        func = m.Attribute(value=func, attr=m.Name(name))
    return m.Call(func=func)


def _has_params(function: cst.FunctionDef, *names: str) -> bool:
    params = {param.name.value for param in (*function.params.posonly_params, *function.params.params)}
    return all(name in params for name in names)


class ServingChatTransformer(_TokenIdsTransformer):
    """srt/entrypoints/openai/serving_chat.py: wire ``OpenAIServingChat`` to the runtime."""

    ANCHORS = {
        "runtime-import": "the module's first import (ours goes after it)",
        "_generate_chat_stream": "OpenAIServingChat._generate_chat_stream(self, adapted_request, request, ...)",
        "engine-outputs": "its `async for` over self.tokenizer_manager.generate_request(...)",
        "_build_chat_response-call": "self._build_chat_response(request, ret, ...) in _handle_non_streaming_request",
    }
    # 0.5.23 added its own return_token_ids (non-streaming only) and rejects it on stream requests.
    STREAM_CHECK = (
        "stream-return-token-ids-check",
        "`if request.return_token_ids: raise ...` in _convert_to_internal_request (removed)",
    )

    def __init__(self, context: PatchContext) -> None:
        super().__init__(context)
        self.rejects_stream_token_ids = context.version >= Version("0.5.23")
        if self.rejects_stream_token_ids:
            self.anchors[self.STREAM_CHECK[0]] = self.STREAM_CHECK[1]
        self._scope: list[str] = []  # enclosing class and function names
        self._adapted_request: str | None = None
        self._mark_statement = False

    def _in_method(self, name: str) -> bool:
        return self._scope[-2:] == ["OpenAIServingChat", name]

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._scope.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self._scope.pop()
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scope.append(node.name.value)
        if self._in_method("_handle_non_streaming_request"):
            self._adapted_request = "adapted_request" if _has_params(node, "adapted_request") else None

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if self._in_method("_generate_chat_stream") and _has_params(updated_node, "adapted_request", "request"):
            self.hit("_generate_chat_stream")
            updated_node = updated_node.with_changes(
                decorators=[*updated_node.decorators, self._decorator(f"{RUNTIME}.stream_token_ids")]
            )
        self._scope.pop()
        return updated_node

    # streaming: tap the engine outputs

    def leave_For(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        if (
            self._in_method("_generate_chat_stream")
            and updated_node.asynchronous is not None
            and m.matches(updated_node.iter, _self_call("tokenizer_manager", "generate_request"))
        ):
            self.hit("engine-outputs")
            body = updated_node.body
            header = body.header  # type: ignore[union-attr]
            return updated_node.with_changes(
                iter=cst.Call(func=cst.parse_expression(f"{RUNTIME}.tap"), args=[cst.Arg(updated_node.iter)]),
                body=body.with_changes(
                    header=header.with_changes(
                        whitespace=cst.SimpleWhitespace("  "), comment=self._comment(header.comment)
                    )
                ),
            )
        return updated_node

    # non-streaming: ids onto the built response

    def visit_SimpleStatementLine(self, node: cst.SimpleStatementLine) -> None:
        self._mark_statement = False

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if (
            self._in_method("_handle_non_streaming_request")
            and m.matches(updated_node, _self_call("_build_chat_response"))
            and len(updated_node.args) >= 2
            and self._adapted_request is not None
        ):
            self.hit("_build_chat_response-call")
            self._mark_statement = True
            request, outputs = (arg.value.deep_clone() for arg in updated_node.args[:2])
            return cst.Call(
                func=cst.parse_expression(f"{RUNTIME}.add_to_response"),
                args=[
                    cst.Arg(updated_node),
                    cst.Arg(request),
                    cst.Arg(cst.Name(self._adapted_request)),
                    cst.Arg(outputs),
                ],
            )
        return updated_node

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        if self._mark_statement:
            self._mark_statement = False
            return self._marked_line(updated_node)
        return updated_node

    # 0.5.23: stream requests may ask for return_token_ids

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.BaseStatement:
        if (
            self.rejects_stream_token_ids
            and self._in_method("_convert_to_internal_request")
            and m.matches(updated_node.test, m.Attribute(value=m.Name("request"), attr=m.Name("return_token_ids")))
            and updated_node.orelse is None
            and m.matches(
                updated_node.body, m.IndentedBlock(body=[m.SimpleStatementLine(body=[m.Raise()])])
            )
        ):
            self.hit(self.STREAM_CHECK[0])
            removed = cst.parse_statement(
                f"pass  {self.marker}: stream requests may set return_token_ids\n"
            )
            return removed.with_changes(leading_lines=updated_node.leading_lines)
        return updated_node
