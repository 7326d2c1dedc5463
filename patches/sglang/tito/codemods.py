"""The tito edits, one transformer per SGLang file; the logic they call is in ``runtime.py``.

protocol.py: ``input_ids`` (0.5.13 on have it already) and ``logprob_start_len`` on
``ChatCompletionRequest`` plus a "before" validator that calls the runtime; ``token_id`` on
``TopLogprob`` and ``ChatCompletionTokenLogprob``; ``prompt_logprobs`` on ``ChatCompletionResponse``,
left out of the JSON when None.

http_server.py: ``openai_v1_chat_completions`` also answers ``/v1/chat/completions/tokens``
(prime-rl / verifiers' token route; the validator maps its ``tokens`` field to ``input_ids``).

serving_chat.py (``OpenAIServingChat``): ``_validate_request`` lets ``messages`` be empty when
``input_ids`` are sent; ``_process_messages`` skips the chat template for ``input_ids`` (0.5.13 on have
that branch already: it is checked, not edited); ``_convert_to_internal_request`` is decorated (ids
checked against the model, ``logprob_start_len`` passed on); ``_build_chat_response`` is decorated
(``prompt_logprobs``); the logprob builders are decorated (``token_id``): the raw-triple builder where
the release has one (0.5.21 on), else its two callers. Each choice is made by what the code has.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import (MODULE, AnchoredTransformer, PatchContext, after_last_field, has_params, in_method,
                             is_field, with_body)
from toolkit.patches.sglang.token_ids.codemods import (
    WRAP_SERIALIZER,  # the serializer both patches decorate
)

RUNTIME = "_toolkit_tito"
PACKAGE = "toolkit.patches.sglang.tito"
SERVING = "OpenAIServingChat"


# --------------------------------------------------------------------------------------------------
# sglang/srt/entrypoints/openai/protocol.py

INPUT_IDS_FIELD = "input_ids: Optional[List[int]] = None"
LOGPROB_START_FIELD = "logprob_start_len: Optional[int] = None"
PREFIX_FIELD = "prefix_token_ids: Optional[List[int]] = None"


class ProtocolTransformer(AnchoredTransformer):
    RUNTIME, RUNTIME_ALIAS = PACKAGE, RUNTIME
    INSIDE = {name: frozenset() for name in  # module-level classes; no method is edited
              ("ChatCompletionRequest", "TopLogprob", "ChatCompletionTokenLogprob", "ChatCompletionResponse")}
    ANCHORS = {
        "ChatCompletionRequest": "class ChatCompletionRequest (gets logprob_start_len, prefix_token_ids, input_ids "
        "unless present, and a validator)",
        "TopLogprob": "class TopLogprob (gets a token_id field)",
        "ChatCompletionTokenLogprob": "class ChatCompletionTokenLogprob (gets a token_id field)",
        "ChatCompletionResponse.serializer": "ChatCompletionResponse's model_serializer(mode=\"wrap\") "
        "(prompt_logprobs is left out when None)",
    }

    @m.leave(m.ClassDef(name=m.Name("TopLogprob") | m.Name("ChatCompletionTokenLogprob")))
    def logprob_token_id(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.hit(updated_node.name.value)
        body = list(cst.ensure_type(updated_node.body, cst.IndentedBlock).body)
        new = self.marked_statement("token_id: Optional[int] = None")
        tokens = [position for position, statement in enumerate(body) if is_field(statement, "token")]
        if tokens:  # right after the token it names, as in vLLM's entries
            return with_body(updated_node, [*body[: tokens[0] + 1], new, *body[tokens[0] + 1:]])
        return with_body(updated_node, after_last_field(body, new, before_methods=True))

    @m.leave(m.ClassDef(name=m.Name("ChatCompletionRequest")))
    def request_fields(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.hit("ChatCompletionRequest")
        body = list(cst.ensure_type(updated_node.body, cst.IndentedBlock).body)
        fields = [self.marked_statement(LOGPROB_START_FIELD), self.marked_statement(PREFIX_FIELD)]
        if not any(is_field(statement, "input_ids") for statement in body):
            fields.insert(0, self.marked_statement(INPUT_IDS_FIELD))
        validator = self.before_validator("_toolkit_tito_request", f"{RUNTIME}.normalize_request")
        return with_body(updated_node, [*after_last_field(body, fields, before_methods=True), validator])

    @m.leave(m.ClassDef(name=m.Name("ChatCompletionResponse")))
    def prompt_logprobs_field(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        body = list(cst.ensure_type(updated_node.body, cst.IndentedBlock).body)
        found = False
        for position, statement in enumerate(body):
            if isinstance(statement, cst.FunctionDef) and any(
                m.matches(decorator, WRAP_SERIALIZER) for decorator in statement.decorators
            ):
                self.hit("ChatCompletionResponse.serializer")
                decorators = list(statement.decorators)
                index = next(i for i, d in enumerate(decorators) if m.matches(d, WRAP_SERIALIZER))
                decorators.insert(index + 1, self.marked_decorator(f'{RUNTIME}.omit_when_none("prompt_logprobs")'))
                body[position] = statement.with_changes(decorators=decorators)
                found = True
        if not found:
            return updated_node
        field = self.marked_statement("prompt_logprobs: Optional[List[Optional[Dict[str, Any]]]] = None")
        return with_body(updated_node, after_last_field(body, field, before_methods=True))


# --------------------------------------------------------------------------------------------------
# sglang/srt/entrypoints/openai/serving_chat.py

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


class ServingChatTransformer(AnchoredTransformer):
    RUNTIME, RUNTIME_ALIAS = PACKAGE, RUNTIME
    ANCHORS = {
        "messages-required": "`if not request.messages:` in OpenAIServingChat._validate_request "
        "(input_ids make messages optional)",
        "_convert_to_internal_request": "OpenAIServingChat._convert_to_internal_request(self, request, ...)",
        "_build_chat_response": "OpenAIServingChat._build_chat_response(self, request, ret, ...)",
    }
    # one of each pair, by what the release has (visit_Module)
    PATH_ANCHORS = {
        "template-branch": "`if self.template_manager.chat_template_name is None:` in "
        "OpenAIServingChat._process_messages (input_ids go first)",
        "input-ids-branch": "`if request.input_ids is not None:` in OpenAIServingChat._process_messages "
        "(upstream's template bypass, relied on, not edited)",
        "_process_response_logprobs": "OpenAIServingChat._process_response_logprobs(self, ret_item)",
        "_process_streaming_logprobs": "OpenAIServingChat._process_streaming_logprobs(self, content, n_prev_token)",
        "_build_token_logprobs_from_raw": "OpenAIServingChat._build_token_logprobs_from_raw(self, "
        "output_token_logprobs, output_top_logprobs)",
    }
    # method -> (runtime decorator, parameters it must have)
    DECORATED = {
        "_convert_to_internal_request": ("convert_request", ("request",)),
        "_build_chat_response": ("finish_chat_response", ("request", "ret")),
        "_process_response_logprobs": ("response_logprob_ids", ("ret_item",)),
        "_process_streaming_logprobs": ("stream_logprob_ids", ("content", "n_prev_token")),
        "_build_token_logprobs_from_raw": ("logprob_ids_from_raw", ("output_token_logprobs", "output_top_logprobs")),
    }
    INSIDE = {SERVING: frozenset({*DECORATED, "_validate_request", "_process_messages"})}

    def __init__(self, context: PatchContext) -> None:
        super().__init__(context)
        self.native_input_ids = False  # decided in visit_Module, from the code
        self.raw_logprobs = False

    def visit_Module(self, node: cst.Module) -> bool:
        # Each path by what the release's OpenAIServingChat has, never by its version number: its own
        # `if request.input_ids is not None:` template bypass in _process_messages (0.5.13 on) is relied
        # on, else ours goes before the template branch; where every logprob entry is built by
        # _build_token_logprobs_from_raw (0.5.21 on) that builder is decorated, else the two callers.
        methods = {statement.name.value: statement for statement in _class_body(node, SERVING)
                   if isinstance(statement, cst.FunctionDef)}
        process = methods.get("_process_messages")
        self.native_input_ids = process is not None and bool(m.findall(process, m.If(test=INPUT_IDS_TEST)))
        self.raw_logprobs = "_build_token_logprobs_from_raw" in methods
        for anchor in ("input-ids-branch" if self.native_input_ids else "template-branch",
                       *(("_build_token_logprobs_from_raw",) if self.raw_logprobs else
                         ("_process_response_logprobs", "_process_streaming_logprobs"))):
            self.anchors[anchor] = self.PATH_ANCHORS[anchor]
        return True

    @m.leave(m.FunctionDef(name=m.OneOf(*(m.Name(name) for name in DECORATED))))
    @m.call_if_inside(m.ClassDef(name=m.Name(SERVING)))
    def decorate(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        name = updated_node.name.value
        decorator, params = self.DECORATED[name]
        if name not in self.anchors or not has_params(updated_node, *params):
            return updated_node  # another release's method, or a changed signature: a missing anchor, by name
        self.hit(name)
        return updated_node.with_changes(decorators=[*updated_node.decorators,
                                                     self.marked_decorator(f"{RUNTIME}.{decorator}")])

    @m.leave(m.If(test=MESSAGES_TEST))
    @in_method(SERVING, "_validate_request")
    def messages_optional_with_input_ids(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        self.hit("messages-required")
        return updated_node.with_changes(
            test=cst.parse_expression(f"not request.messages and not {RUNTIME}.has_input_ids(request)"),
            whitespace_after_test=cst.SimpleWhitespace(""),
            body=updated_node.body.with_changes(
                header=cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace("  "), comment=cst.Comment(self.marker))),
        )

    @m.leave(m.If(test=INPUT_IDS_TEST))
    @in_method(SERVING, "_process_messages")
    def upstream_input_ids_branch(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if self.native_input_ids:
            self.hit("input-ids-branch")
        return updated_node

    @m.leave(m.If(test=TEMPLATE_TEST))
    @in_method(SERVING, "_process_messages")
    def input_ids_skip_the_template(self, original_node: cst.If, updated_node: cst.If) -> cst.BaseStatement:
        if self.native_input_ids:
            return updated_node
        self.hit("template-branch")
        branch = self.marked_statement(
            f"if {RUNTIME}.has_input_ids(request):\n"
            f"    result = {RUNTIME}.processed_input_ids(request, MessageProcessingResult)\n"
        )
        return branch.with_changes(leading_lines=updated_node.leading_lines,
                                   orelse=updated_node.with_changes(leading_lines=[]))


def _class_body(module: cst.Module, name: str) -> list[cst.BaseStatement]:
    """The statements of the module-level class ``name`` (none when it has no such class)."""
    for statement in module.body:
        if isinstance(statement, cst.ClassDef) and statement.name.value == name:
            return list(cst.ensure_type(statement.body, cst.IndentedBlock).body)
    return []


# --------------------------------------------------------------------------------------------------
# sglang/srt/entrypoints/http_server.py

CHAT_ROUTE = m.Decorator(decorator=m.Call(func=m.Attribute(value=m.Name("app"), attr=m.Name("post")),
                                          args=[m.Arg(value=m.SimpleString('"/v1/chat/completions"')), m.ZeroOrMore()]))
TOKENS_ROUTE = 'app.post("/v1/chat/completions/tokens", dependencies=[Depends(validate_json_request)], include_in_schema=False)'


class HttpServerTransformer(AnchoredTransformer):
    INSIDE = {MODULE: frozenset({"openai_v1_chat_completions"})}
    ANCHORS = {"chat-route": "the @app.post(\"/v1/chat/completions\", ...) decorator of openai_v1_chat_completions"}

    @m.leave(m.FunctionDef(name=m.Name("openai_v1_chat_completions")))
    def tokens_route(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        return self.decorated_before(updated_node, CHAT_ROUTE, "chat-route", TOKENS_ROUTE)
