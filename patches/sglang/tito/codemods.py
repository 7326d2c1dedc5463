"""The tito edits, one transformer per SGLang file; the logic they call is in ``runtime.py``.

protocol.py: ``input_ids`` (0.5.23 has it already) and ``logprob_start_len`` on
``ChatCompletionRequest`` plus a "before" validator that calls the runtime; ``token_id`` on
``TopLogprob`` and ``ChatCompletionTokenLogprob``; ``prompt_logprobs`` on ``ChatCompletionResponse``,
left out of the JSON when None.

serving_chat.py (``OpenAIServingChat``): ``_validate_request`` lets ``messages`` be empty when
``input_ids`` are sent; ``_process_messages`` skips the chat template for ``input_ids`` (0.5.23 has
that branch already: it is checked, not edited); ``_convert_to_internal_request`` is decorated (ids
checked against the model, ``logprob_start_len`` passed on); ``_build_chat_response`` is decorated
(``prompt_logprobs``); the logprob builders are decorated (``token_id``).
"""

from __future__ import annotations

from collections.abc import Sequence

import libcst as cst
import libcst.matchers as m
from packaging.version import Version

from toolkit.patches.sglang.token_ids.codemods import (
    WRAP_SERIALIZER,  # the serializer both patches decorate
)
from toolkit.codemod import AnchoredTransformer, PatchContext

RUNTIME = "_toolkit_tito"
RUNTIME_IMPORT = f"from toolkit.patches.sglang.tito import runtime as {RUNTIME}"
NEW_API = Version("0.5.23")  # input_ids upstream; logprob entries built from the engine's raw triples


class _TitoTransformer(AnchoredTransformer):
    """The runtime import (after the module's first import), scope tracking and marked edits."""

    def __init__(self, context: PatchContext) -> None:
        super().__init__(context)
        self._scope: list[str] = []  # enclosing class and function names, outermost first
        self.new_api = context.version >= NEW_API

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return self.insert_after_first_import(updated_node, RUNTIME_IMPORT, "runtime-import")

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

    def _in_method(self, name: str) -> bool:
        return self._scope[-2:] == ["OpenAIServingChat", name]

    def _decorator(self, code: str) -> cst.Decorator:
        return cst.Decorator(
            decorator=cst.parse_expression(code),
            trailing_whitespace=cst.TrailingWhitespace(
                whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(self.marker)
            ),
        )

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


def _has_params(function: cst.FunctionDef, *names: str) -> bool:
    params = {param.name.value for param in (*function.params.posonly_params, *function.params.params)}
    return all(name in params for name in names)


# --------------------------------------------------------------------------------------------------
# sglang/srt/entrypoints/openai/protocol.py

INPUT_IDS_FIELD = "input_ids: Optional[List[int]] = None"
LOGPROB_START_FIELD = "logprob_start_len: Optional[int] = None"

REQUEST_VALIDATOR = '''
@model_validator(mode="before")
@classmethod
def _toolkit_tito_request(cls, data):
    return {runtime}.normalize_request(data)
'''

class ProtocolTransformer(_TitoTransformer):
    ANCHORS = {
        "runtime-import": "the module's first import (the runtime import goes after it)",
        "ChatCompletionRequest": "class ChatCompletionRequest (gets logprob_start_len, input_ids unless present, "
        "and a validator)",
        "TopLogprob": "class TopLogprob (gets a token_id field)",
        "ChatCompletionTokenLogprob": "class ChatCompletionTokenLogprob (gets a token_id field)",
        "ChatCompletionResponse.serializer": "ChatCompletionResponse's model_serializer(mode=\"wrap\") "
        "(prompt_logprobs is left out when None)",
    }

    def edit_class(self, name: str, node: cst.ClassDef) -> cst.BaseStatement:
        if self._scope:  # module-level classes only
            return node
        body = list(node.body.body)
        if name in ("TopLogprob", "ChatCompletionTokenLogprob"):
            self.hit(name)
            new = self.marked_statement("token_id: Optional[int] = None")
            tokens = [position for position, statement in enumerate(body) if _is_field(statement, "token")]
            if tokens:  # right after the token it names, as in vLLM's entries
                return _with_body(node, [*body[: tokens[0] + 1], new, *body[tokens[0] + 1 :]])
            return _with_body(node, _after_last_field(body, [new]))
        if name == "ChatCompletionRequest":
            self.hit("ChatCompletionRequest")
            fields = [self.marked_statement(LOGPROB_START_FIELD)]
            if not any(_is_field(statement, "input_ids") for statement in body):
                fields.insert(0, self.marked_statement(INPUT_IDS_FIELD))
            validator = cst.parse_module(REQUEST_VALIDATOR.format(runtime=RUNTIME).lstrip()).body[0]
            assert isinstance(validator, cst.FunctionDef)
            validator = validator.with_changes(
                leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(comment=cst.Comment(self.marker))]
            )
            return _with_body(node, [*_after_last_field(body, fields), validator])
        if name == "ChatCompletionResponse":
            found = False
            for position, statement in enumerate(body):
                if isinstance(statement, cst.FunctionDef) and any(
                    m.matches(decorator, WRAP_SERIALIZER) for decorator in statement.decorators
                ):
                    self.hit("ChatCompletionResponse.serializer")
                    decorators = list(statement.decorators)
                    index = next(i for i, d in enumerate(decorators) if m.matches(d, WRAP_SERIALIZER))
                    decorators.insert(index + 1, self._decorator(f'{RUNTIME}.omit_when_none("prompt_logprobs")'))
                    body[position] = statement.with_changes(decorators=decorators)
                    found = True
            if found:
                body = _after_last_field(
                    body, [self.marked_statement("prompt_logprobs: Optional[List[Optional[Dict[str, Any]]]] = None")]
                )
                return _with_body(node, body)
        return node


# --------------------------------------------------------------------------------------------------
# sglang/srt/entrypoints/openai/serving_chat.py


class ServingChatTransformer(_TitoTransformer):
    ANCHORS = {
        "runtime-import": "the module's first import (the runtime import goes after it)",
        "messages-required": "`if not request.messages:` in OpenAIServingChat._validate_request "
        "(input_ids make messages optional)",
        "_convert_to_internal_request": "OpenAIServingChat._convert_to_internal_request(self, request, ...)",
        "_build_chat_response": "OpenAIServingChat._build_chat_response(self, request, ret, ...)",
    }
    OLD_ANCHORS = {
        "template-branch": "`if self.template_manager.chat_template_name is None:` in "
        "OpenAIServingChat._process_messages (input_ids go first)",
        "_process_response_logprobs": "OpenAIServingChat._process_response_logprobs(self, ret_item)",
        "_process_streaming_logprobs": "OpenAIServingChat._process_streaming_logprobs(self, content, n_prev_token)",
    }
    NEW_ANCHORS = {
        "input-ids-branch": "`if request.input_ids is not None:` in OpenAIServingChat._process_messages "
        "(upstream's template bypass, relied on, not edited)",
        "_build_token_logprobs_from_raw": "OpenAIServingChat._build_token_logprobs_from_raw(self, "
        "output_token_logprobs, output_top_logprobs)",
    }
    # method -> (anchor, runtime decorator, parameters it must have)
    DECORATED = {
        "_convert_to_internal_request": ("convert_request", ("request",)),
        "_build_chat_response": ("with_prompt_logprobs", ("request", "ret")),
        "_process_response_logprobs": ("response_logprob_ids", ("ret_item",)),
        "_process_streaming_logprobs": ("stream_logprob_ids", ("content", "n_prev_token")),
        "_build_token_logprobs_from_raw": ("logprob_ids_from_raw", ("output_token_logprobs", "output_top_logprobs")),
    }

    TEMPLATE_TEST = m.Comparison(
        left=m.Attribute(value=m.Attribute(value=m.Name("self"), attr=m.Name("template_manager")),
                         attr=m.Name("chat_template_name")),
        comparisons=[m.ComparisonTarget(operator=m.Is(), comparator=m.Name("None"))],
    )
    INPUT_IDS_TEST = m.Comparison(
        left=m.Attribute(value=m.Name("request"), attr=m.Name("input_ids")),
        comparisons=[m.ComparisonTarget(operator=m.IsNot(), comparator=m.Name("None"))],
    )
    MESSAGES_TEST = m.UnaryOperation(operator=m.Not(), expression=m.Attribute(value=m.Name("request"),
                                                                              attr=m.Name("messages")))

    def __init__(self, context: PatchContext) -> None:
        super().__init__(context)
        self.anchors.update(self.NEW_ANCHORS if self.new_api else self.OLD_ANCHORS)

    def edit_function(self, name: str, node: cst.FunctionDef) -> cst.BaseStatement:
        if self._scope != ["OpenAIServingChat"] or name not in self.DECORATED or name not in self.anchors:
            return node
        decorator, params = self.DECORATED[name]
        if not _has_params(node, *params):
            return node  # a changed signature is a missing anchor, reported by name
        self.hit(name)
        return node.with_changes(decorators=[*node.decorators, self._decorator(f"{RUNTIME}.{decorator}")])

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.BaseStatement:
        if self._in_method("_validate_request") and m.matches(updated_node.test, self.MESSAGES_TEST):
            self.hit("messages-required")
            test = cst.parse_expression(f"not request.messages and not {RUNTIME}.has_input_ids(request)")
            return updated_node.with_changes(
                test=test,
                whitespace_after_test=cst.SimpleWhitespace(""),
                body=updated_node.body.with_changes(
                    header=cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(self.marker))
                ),
            )
        if not self._in_method("_process_messages"):
            return updated_node
        if self.new_api:
            if m.matches(updated_node.test, self.INPUT_IDS_TEST):
                self.hit("input-ids-branch")
            return updated_node
        if m.matches(updated_node.test, self.TEMPLATE_TEST):
            self.hit("template-branch")
            branch = cst.parse_statement(
                f"if {RUNTIME}.has_input_ids(request):  {self.marker}\n"
                f"    result = {RUNTIME}.processed_input_ids(request, MessageProcessingResult)\n"
            )
            assert isinstance(branch, cst.If)
            return branch.with_changes(leading_lines=updated_node.leading_lines,
                                       orelse=updated_node.with_changes(leading_lines=[]))
        return updated_node
