"""The token-ids edits, one transformer per SGLang file; the logic they call is in ``runtime.py``.

protocol.py: ``return_token_ids`` on the chat request (0.5.17 on have it already), ``prompt_token_ids``
on the response and ``token_ids`` on its choices (0.5.17 has its own), left out of the JSON when None.

serving_chat.py: the chat stream generator is wrapped and its engine outputs tapped (streaming);
the built non-streaming response gets its ids; the rejection of ``return_token_ids`` on stream
requests (0.5.17 on, where the release has its own flag) goes.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import (AnchoredTransformer, PatchContext, after_last_field, class_named, has_params, in_method, is_field,
                             self_call, with_body)

RUNTIME = "_toolkit_token_ids"
PACKAGE = "toolkit.patches.sglang.token_ids"
SERVING = "OpenAIServingChat"

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


class ProtocolTransformer(AnchoredTransformer):
    """srt/entrypoints/openai/protocol.py: the request flag and the response fields."""

    RUNTIME, RUNTIME_ALIAS = PACKAGE, RUNTIME
    ANCHORS = {
        "ChatCompletionRequest": "class ChatCompletionRequest (return_token_ids added unless present)",
        "ChatCompletionResponse.serializer": 'ChatCompletionResponse\'s model_serializer(mode="wrap")',
        "ChatCompletionResponseChoice.serializer": 'ChatCompletionResponseChoice\'s model_serializer(mode="wrap")',
    }
    # class -> the field it gets, left out of the JSON when None
    RESPONSE_FIELDS = {
        "ChatCompletionResponse": "prompt_token_ids",
        "ChatCompletionResponseChoice": "token_ids",
    }

    @m.leave(class_named("ChatCompletionRequest"))
    def request_flag(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.hit("ChatCompletionRequest")
        body = list(cst.ensure_type(updated_node.body, cst.IndentedBlock).body)
        if any(is_field(statement, "return_token_ids") for statement in body):
            return updated_node  # 0.5.17 on have their own
        body = after_last_field(body, self.marked_statement("return_token_ids: bool = False"))
        return with_body(updated_node, body)

    @m.leave(class_named(tuple(RESPONSE_FIELDS)))
    def response_field(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        name = updated_node.name.value
        field = self.RESPONSE_FIELDS[name]
        body = list(cst.ensure_type(updated_node.body, cst.IndentedBlock).body)
        serializers = [position for position, statement in enumerate(body) if isinstance(statement, cst.FunctionDef)
                       and any(m.matches(decorator, WRAP_SERIALIZER) for decorator in statement.decorators)]
        if not serializers:
            return updated_node
        if any(is_field(statement, field) for statement in body):
            # The release's own field (0.5.17's ChatCompletionResponseChoice.token_ids): the runtime fills
            # it, the release's serializer decides how it is written, as it does unpatched.
            for _ in serializers:
                self.hit(f"{name}.serializer")
            return updated_node
        for position in serializers:
            self.hit(f"{name}.serializer")
            body[position] = self._omit_when_none(cst.ensure_type(body[position], cst.FunctionDef), field)
        body = after_last_field(body, self.marked_statement(f"{field}: list[int] | None = None"))
        return with_body(updated_node, body)

    def _omit_when_none(self, serializer: cst.FunctionDef, field: str) -> cst.FunctionDef:
        """Our decorator right under pydantic's, so pydantic wraps the serializer that drops the field."""
        decorators = list(serializer.decorators)
        position = next(i for i, decorator in enumerate(decorators) if m.matches(decorator, WRAP_SERIALIZER))
        decorators.insert(position + 1, self.marked_decorator(f'{RUNTIME}.omit_when_none("{field}")'))
        return serializer.with_changes(decorators=decorators)


class ServingChatTransformer(AnchoredTransformer):
    """srt/entrypoints/openai/serving_chat.py: wire ``OpenAIServingChat`` to the runtime."""

    RUNTIME, RUNTIME_ALIAS = PACKAGE, RUNTIME
    INSIDE = {SERVING: frozenset({"_generate_chat_stream", "_handle_non_streaming_request",
                                  "_convert_to_internal_request"})}
    ANCHORS = {
        "_generate_chat_stream": "OpenAIServingChat._generate_chat_stream(self, adapted_request, request, ...)",
        "engine-outputs": "its `async for` over self.tokenizer_manager.generate_request(...)",
        "_build_chat_response-call": "self._build_chat_response(request, ret, ...) in _handle_non_streaming_request",
    }
    # 0.5.17 added its own return_token_ids (non-streaming only) and rejects it on stream requests.
    STREAM_CHECK = (
        "stream-return-token-ids-check",
        "`if request.return_token_ids: raise ...` in _convert_to_internal_request (removed)",
    )

    def __init__(self, context: PatchContext) -> None:
        super().__init__(context)
        self.rejects_stream_token_ids = False
        self._adapted_request: str | None = None

    def visit_Module(self, node: cst.Module) -> bool:
        # Every release that reads its own request.return_token_ids (0.5.17 on, by structure rather than
        # by number) also rejects it on stream requests: that check must be found and goes.
        if m.findall(node, m.Attribute(value=m.Name("request"), attr=m.Name("return_token_ids"))):
            self.rejects_stream_token_ids = True
            self.anchors[self.STREAM_CHECK[0]] = self.STREAM_CHECK[1]
        return True

    # streaming: the generator is wrapped, the engine outputs tapped

    @m.leave(m.FunctionDef(name=m.Name("_generate_chat_stream")))
    @m.call_if_inside(m.ClassDef(name=m.Name(SERVING)))
    def wrap_stream(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if not has_params(updated_node, "adapted_request", "request"):
            return updated_node
        self.hit("_generate_chat_stream")
        decorator = self.marked_decorator(f"{RUNTIME}.stream_token_ids")
        return updated_node.with_changes(decorators=[*updated_node.decorators, decorator])

    @m.leave(m.For(asynchronous=m.Asynchronous(), iter=self_call("tokenizer_manager", "generate_request")))
    @in_method(SERVING, "_generate_chat_stream")
    def tap_engine_outputs(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        self.hit("engine-outputs")
        return updated_node.with_changes(
            iter=cst.Call(func=cst.parse_expression(f"{RUNTIME}.tap"), args=[cst.Arg(updated_node.iter)]),
            body=self.marked_header(updated_node.body),  # type: ignore[arg-type]
        )

    # non-streaming: ids onto the built response

    @m.visit(m.FunctionDef(name=m.Name("_handle_non_streaming_request")))
    @m.call_if_inside(m.ClassDef(name=m.Name(SERVING)))
    def note_adapted_request(self, node: cst.FunctionDef) -> None:
        self._adapted_request = "adapted_request" if has_params(node, "adapted_request") else None

    @m.leave(self_call("_build_chat_response"))
    @in_method(SERVING, "_handle_non_streaming_request")
    def fill_response(self, original_node: cst.Call, updated_node: cst.Call) -> cst.BaseExpression:
        if len(updated_node.args) < 2 or self._adapted_request is None:
            return updated_node
        self.hit("_build_chat_response-call")
        self.mark_this_statement()
        request, outputs = (arg.value.deep_clone() for arg in updated_node.args[:2])
        return cst.Call(
            func=cst.parse_expression(f"{RUNTIME}.add_to_response"),
            args=[cst.Arg(updated_node), cst.Arg(request), cst.Arg(cst.Name(self._adapted_request)), cst.Arg(outputs)],
        )

    # 0.5.17 on: stream requests may ask for return_token_ids

    @m.leave(m.If(
        test=m.Attribute(value=m.Name("request"), attr=m.Name("return_token_ids")),
        body=m.IndentedBlock(body=[m.SimpleStatementLine(body=[m.Raise()])]),
        orelse=None,
    ))
    @in_method(SERVING, "_convert_to_internal_request")
    def allow_stream_token_ids(self, original_node: cst.If, updated_node: cst.If) -> cst.BaseStatement:
        if not self.rejects_stream_token_ids:
            return updated_node
        self.hit(self.STREAM_CHECK[0])
        removed = cst.parse_statement(f"pass  {self.marker}: stream requests may set return_token_ids\n")
        return removed.with_changes(leading_lines=updated_node.leading_lines)
