"""The tito edits, one transformer per vLLM file; the logic they call is in ``runtime.py``.

protocol.py: ``input_ids`` and ``logprob_start_len`` fields on ``ChatCompletionRequest`` plus a
"before" validator that calls the runtime; ``token_id`` on ``ChatCompletionLogProb`` (and so on its
subclass ``ChatCompletionLogProbsContent``).

renderers/online_renderer.py: ``_reused_prompt_token_ids`` (vLLM's path for a prompt that arrives
already tokenized) returns ``input_ids`` first, so the ids reach the engine without a template while
tool-choice checks and the parser's ``adjust_request`` still run, for chat and Harmony alike; in
``OnlineRenderer.preprocess_chat`` the rendered prompt gets ``prefix_token_ids`` spliced in. A module
without that function (vLLM before 0.27) gets the two reuse branches it would call it from, for
``input_ids`` only: around the render in ``preprocess_chat`` and first in ``_make_request_with_harmony``.
vLLM 0.24 has both methods on ``OpenAIServingRender`` in entrypoints/serve/render/serving.py: the same
transformer edits that file there.

chat_completion/api_router.py: ``create_chat_completion`` also answers ``/v1/chat/completions/tokens``
(prime-rl / verifiers' token route, whose ``tokens`` field the validator maps to ``input_ids``).

serving.py: the rendered prompt is checked (length, ``logprob_start_len``), logprob entries get
their ids, and prompt logprobs before ``logprob_start_len`` are dropped.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import (MODULE, AnchoredTransformer, PatchContext, after_last_field, class_named, has_params, in_method,
                             with_body)

RUNTIME = "_toolkit_tito"
PACKAGE = "toolkit.patches.vllm.tito"
SERVING = "OpenAIServingChat"


def after_matching(transformer: AnchoredTransformer, block: cst.IndentedBlock, statement: m.BaseMatcherNode,
                   anchor: str, code: str) -> cst.IndentedBlock:
    """``block`` with the marked statement ``code`` after each statement matching ``statement`` (each
    match records ``anchor``)."""
    body: list[cst.BaseStatement] = []
    for item in block.body:
        body.append(item)
        if m.matches(item, statement):
            transformer.hit(anchor)
            body.append(transformer.marked_statement(code))
    return block.with_changes(body=body)


def after_docstring(function: cst.FunctionDef, new: list[cst.BaseStatement]) -> list[cst.BaseStatement]:
    """``function``'s statements with ``new`` first, after its docstring if it has one."""
    body = list(cst.ensure_type(function.body, cst.IndentedBlock).body)
    position = 1 if body and m.matches(body[0], m.SimpleStatementLine(body=[m.Expr(m.SimpleString())])) else 0
    return [*body[:position], *new, *body[position:]]


def with_fields_and_validator(transformer: AnchoredTransformer, request: cst.ClassDef, fields_code: str,
                              validator: str, function: str) -> cst.ClassDef:
    """The request model ``request`` with the marked fields ``fields_code`` after its last field and a
    "before" validator ``validator`` calling ``function`` at the end."""
    fields = [transformer.marked_line(s) if isinstance(s, cst.SimpleStatementLine) else s
              for s in cst.parse_module(fields_code.lstrip()).body]
    body = cst.ensure_type(request.body, cst.IndentedBlock).body
    return with_body(request, [*after_last_field(body, fields, before_methods=True),
                               transformer.before_validator(validator, function)])


# --------------------------------------------------------------------------------------------------
# vllm/entrypoints/openai/chat_completion/protocol.py

def input_ids_field(other: str) -> str:
    """The ``input_ids`` field of a request whose ``other`` field (messages, input) it stands beside."""
    return (
        "input_ids: list[int] | None = Field(\n"
        "    default=None,\n"
        "    description=(\n"
        '        "Token ids to use as the prompt, exactly: no chat template, no tokenization. "\n'
        f'        "`{other}` may still be sent (tool and reasoning parsing) but never changes the prompt."\n'
        "    ),\n"
        ")\n"
    )


REQUEST_FIELDS = "\n" + input_ids_field("messages") + '''logprob_start_len: int | None = Field(
    default=None,
    description=(
        "Return prompt logprobs from this prompt position on (-1: none). Such a request skips "
        "reading the prefix cache."
    ),
)
prefix_token_ids: list[int] | None = Field(
    default=None,
    description=(
        "The exact ids of the conversation's earlier part (e.g. the previous response's "
        "prompt_token_ids + token_ids): the prompt starts with them, then what the template puts after."
    ),
)
'''



class ProtocolTransformer(AnchoredTransformer):
    RUNTIME, RUNTIME_ALIAS = PACKAGE, RUNTIME
    INSIDE = {"ChatCompletionLogProb": frozenset(), "ChatCompletionRequest": frozenset()}  # module-level classes
    ANCHORS = {
        "ChatCompletionLogProb": "class ChatCompletionLogProb (gets a token_id field)",
        "ChatCompletionRequest": "class ChatCompletionRequest (gets input_ids, logprob_start_len and a validator)",
    }

    @m.leave(m.ClassDef(name=m.Name("ChatCompletionLogProb")))
    def logprob_token_id(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.hit("ChatCompletionLogProb")
        body = after_last_field(cst.ensure_type(updated_node.body, cst.IndentedBlock).body,
                                self.marked_statement("token_id: int | None = None"),
                                before_methods=True)
        return with_body(updated_node, body)

    @m.leave(m.ClassDef(name=m.Name("ChatCompletionRequest")))
    def request_fields(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.hit("ChatCompletionRequest")
        return with_fields_and_validator(self, updated_node, REQUEST_FIELDS, "_toolkit_tito_request",
                                         f"{RUNTIME}.normalize_request")


# --------------------------------------------------------------------------------------------------
# vllm/renderers/online_renderer.py


# The class whose preprocess_chat renders a chat prompt: OnlineRenderer (renderers/online_renderer.py,
# 0.25 on); vLLM 0.24 has the same methods on OpenAIServingRender (entrypoints/serve/render/serving.py).
RENDERER_CLASSES = ("OnlineRenderer", "OpenAIServingRender")
RENDER_CHAT = m.SimpleStatementLine(body=[m.Assign(value=m.Await(m.Call(func=m.Attribute(attr=m.Name("render_chat_async")))))])
HOOK = "_reused_prompt_token_ids"
HARMONY = "_make_request_with_harmony"
TOKENS_INPUT_IMPORT = m.SimpleStatementLine(body=[m.ImportFrom(names=[
    m.ZeroOrMore(), m.ImportAlias(name=m.Name("tokens_input"), asname=None), m.ZeroOrMore()])])
SPLICE = f"engine_input = {RUNTIME}.splice_prefix(request, renderer, messages, chat_params, engine_input)"


class OnlineRendererTransformer(AnchoredTransformer):
    RUNTIME, RUNTIME_ALIAS = PACKAGE, RUNTIME
    INSIDE = {MODULE: frozenset({HOOK}), **{name: frozenset({"preprocess_chat", HARMONY}) for name in RENDERER_CLASSES}}
    # Two paths, by what the module has (visit_Module drops the other path's anchors): vLLM's prompt-reuse
    # hook (0.27 on), which input_ids ride on; without it, the two reuse branches 0.27 added, built here
    # around the same render and first in Harmony's request builder.
    ANCHORS = {
        HOOK: "module function _reused_prompt_token_ids(request, renderer, ...)",
        "tokens_input": "`from vllm.inputs import ..., tokens_input` (without _reused_prompt_token_ids: the "
                        "input_ids branches built in its place call it)",
        HARMONY: "OnlineRenderer._make_request_with_harmony(self, request, ...) (0.24: OpenAIServingRender's; without "
                 "_reused_prompt_token_ids: gets an input_ids branch first, as 0.27's reuse branch)",
        "render-chat": "`... = await renderer.render_chat_async(...)` in OnlineRenderer.preprocess_chat (0.24: "
                       "OpenAIServingRender.preprocess_chat)",
    }

    def __init__(self, context: PatchContext) -> None:
        super().__init__(context)
        self.has_hook = True  # decided in visit_Module, from the code

    def visit_Module(self, node: cst.Module) -> bool:
        self.has_hook = any(m.matches(statement, m.FunctionDef(name=m.Name(HOOK))) for statement in node.body)
        for anchor in ("tokens_input", HARMONY) if self.has_hook else (HOOK,):
            del self.anchors[anchor]
        if not self.has_hook and any(m.matches(statement, TOKENS_INPUT_IMPORT) for statement in node.body):
            self.hit("tokens_input")
        return True

    @m.leave(m.IndentedBlock())
    @in_method(RENDERER_CLASSES, "preprocess_chat")
    def splice_prefix(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        if self.has_hook:  # the render is already the hook's else branch
            return after_matching(self, updated_node, RENDER_CHAT, "render-chat", SPLICE)
        body: list[cst.BaseStatement] = []
        for item in updated_node.body:
            if m.matches(item, RENDER_CHAT):
                self.hit("render-chat")
                body += self.input_ids_or_render(cst.ensure_type(item, cst.SimpleStatementLine))
            else:
                body.append(item)
        return updated_node.with_changes(body=body)

    def input_ids_or_render(self, render: cst.SimpleStatementLine) -> list[cst.BaseStatement]:
        """0.27's reuse branch around ``render`` (input_ids as the engine input, conversation empty),
        the splice after the render; what follows (tool-choice checks, ``adjust_request``) runs on both."""
        first = self.marked_statement(f"toolkit_ids = {RUNTIME}.prompt_ids_from_request(request, renderer)")
        marker = self.marker
        branch = cst.ensure_type(cst.parse_statement(
            f"if toolkit_ids is not None:  {marker}\n"
            f"    conversation = []  {marker}\n"
            f'    engine_input = tokens_input(toolkit_ids, cache_salt=getattr(request, "cache_salt", None))  {marker}\n'
            f"else:  {marker}\n"
            "    pass\n"), cst.If)
        orelse = cst.ensure_type(branch.orelse, cst.Else)
        render_branch = [render.with_changes(leading_lines=[]), self.marked_statement(SPLICE)]
        branch = branch.with_changes(orelse=orelse.with_changes(body=orelse.body.with_changes(body=render_branch)))
        return [first.with_changes(leading_lines=render.leading_lines), branch]

    @m.leave(m.FunctionDef(name=m.Name(HARMONY),
                           params=m.Parameters(params=[m.Param(name=m.Name("self")), m.Param(name=m.Name("request")),
                                                       m.ZeroOrMore()])))
    @m.call_if_inside(class_named(RENDERER_CLASSES))
    def harmony_input_ids_first(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        """Without the hook: 0.27's Harmony reuse branch (the ids straight to the engine) comes first."""
        if self.has_hook:
            return updated_node
        self.hit(HARMONY)
        new = [self.marked_statement(f"toolkit_ids = {RUNTIME}.prompt_ids_from_request(request, self.renderer)"),
               self.marked_statement("if toolkit_ids is not None:\n"
                                     "    return [], [tokens_input(toolkit_ids, cache_salt=request.cache_salt)]\n")]
        return with_body(updated_node, after_docstring(updated_node, new))

    @m.leave(m.FunctionDef(name=m.Name(HOOK), params=m.Parameters(params=[m.Param(name=m.Name("request")), m.ZeroOrMore()])))
    def input_ids_first(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self.hit(HOOK)
        if not has_params(updated_node, "renderer"):
            # vLLM 0.30/0.31: `_reused_prompt_token_ids(request)`; the renderer (for the vocabulary
            # check) comes from its callers, OnlineRenderer's methods (pass_the_renderer)
            params = updated_node.params
            updated_node = updated_node.with_changes(params=params.with_changes(params=[
                *params.params, cst.Param(cst.Name("renderer"), default=cst.Name("None"),
                                          equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                                whitespace_after=cst.SimpleWhitespace("")))]))
        new = [
            self.marked_statement(f"toolkit_ids = {RUNTIME}.prompt_ids_from_request(request, renderer)"),
            self.marked_statement("if toolkit_ids is not None:\n    return toolkit_ids\n"),
        ]
        return with_body(updated_node, after_docstring(updated_node, new))

    @m.leave(m.Call(func=m.Name(HOOK), args=[m.Arg(value=m.Name("request"), keyword=None)]))
    @m.call_if_inside(class_named(RENDERER_CLASSES))
    def pass_the_renderer(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        """vLLM 0.30/0.31's callers pass only the request: add ``renderer=self.renderer``."""
        return updated_node.with_changes(args=[
            updated_node.args[0].with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))),
            cst.Arg(cst.parse_expression("self.renderer"), keyword=cst.Name("renderer"),
                    equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                          whitespace_after=cst.SimpleWhitespace("")))])


# --------------------------------------------------------------------------------------------------
# vllm/entrypoints/openai/chat_completion/serving.py

RENDERED = m.SimpleStatementLine(
    body=[m.Assign(targets=[m.AssignTarget(target=m.Tuple(elements=[m.ZeroOrMore(), m.Element(m.Name("engine_inputs"))]))])]
)
RETURN_LOGPROBS = m.SimpleStatementLine(body=[m.Return(value=m.Call(func=m.Name("ChatCompletionLogProbs")))])


class ServingTransformer(AnchoredTransformer):
    RUNTIME, RUNTIME_ALIAS = PACKAGE, RUNTIME
    INSIDE = {SERVING: frozenset({"_create_chat_completion", "_create_chat_logprobs", "chat_completion_full_generator"})}
    ANCHORS = {
        "rendered-prompt": "`conversation, engine_inputs = ...` in OpenAIServingChat._create_chat_completion",
        "logprobs-return": "`return ChatCompletionLogProbs(...)` in OpenAIServingChat._create_chat_logprobs",
        "prompt-logprobs": "the prompt_logprobs= argument of ChatCompletionResponse(...) in "
        "OpenAIServingChat.chat_completion_full_generator",
    }

    @m.leave(m.IndentedBlock())
    @in_method(SERVING, "_create_chat_completion")
    def check_rendered_prompt(self, original_node: cst.IndentedBlock,
                              updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return after_matching(self, updated_node, RENDERED, "rendered-prompt",
                              f"{RUNTIME}.check_prompt(request, engine_inputs, self.model_config.max_model_len)")

    @m.leave(RETURN_LOGPROBS)
    @in_method(SERVING, "_create_chat_logprobs")
    def logprob_ids(self, original_node: cst.SimpleStatementLine,
                    updated_node: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        self.hit("logprobs-return")
        ret = cst.ensure_type(updated_node.body[0], cst.Return)  # RETURN_LOGPROBS matched a return
        wrapped = cst.ensure_type(
            cst.parse_expression(f"{RUNTIME}.with_logprob_token_ids(VALUE, token_ids, top_logprobs)"), cst.Call)
        wrapped = wrapped.with_changes(args=[wrapped.args[0].with_changes(value=ret.value), *wrapped.args[1:]])
        return self.marked_line(updated_node.with_changes(body=[ret.with_changes(value=wrapped)]))

    @m.leave(m.Call(func=m.Name("ChatCompletionResponse")))
    @in_method(SERVING, "chat_completion_full_generator")
    def prompt_logprobs_from_start(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        args = []
        for arg in updated_node.args:
            if m.matches(arg, m.Arg(keyword=m.Name("prompt_logprobs"))):
                self.hit("prompt-logprobs")
                value = cst.ensure_type(cst.parse_expression(f"{RUNTIME}.prompt_logprobs_from(request, VALUE)"), cst.Call)
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


# --------------------------------------------------------------------------------------------------
# vllm/entrypoints/openai/chat_completion/api_router.py

TOKENS_ROUTE = ('router.post("/v1/chat/completions/tokens", dependencies=[Depends(validate_json_request)], '
                'include_in_schema=False)')


class ApiRouterTransformer(AnchoredTransformer):
    INSIDE = {MODULE: frozenset({"create_chat_completion"})}
    ANCHORS = {"chat-route": "the @router.post(\"/v1/chat/completions\", ...) decorator of create_chat_completion"}

    @m.leave(m.FunctionDef(name=m.Name("create_chat_completion")))
    def tokens_route(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        route = m.Decorator(decorator=m.Call(func=m.Attribute(value=m.Name("router"), attr=m.Name("post")),
                                             args=[m.Arg(value=m.SimpleString('"/v1/chat/completions"')), m.ZeroOrMore()]))
        return self.decorated_before(updated_node, route, "chat-route", TOKENS_ROUTE)


# --------------------------------------------------------------------------------------------------
# vllm/entrypoints/openai/responses/protocol.py and responses/serving.py (the Responses API)

RESPONSES_REQUEST_FIELDS = "\n" + input_ids_field("input") + '''return_token_ids: bool | None = Field(
    default=None,
    description="Return the prompt's token ids and the output's on the response (prompt_token_ids, token_ids).",
)
'''


class ResponsesProtocolTransformer(AnchoredTransformer):
    RUNTIME, RUNTIME_ALIAS = PACKAGE, RUNTIME
    INSIDE = {"ResponsesRequest": frozenset()}
    ANCHORS = {"ResponsesRequest": "class ResponsesRequest (gets input_ids, return_token_ids and a validator)"}

    @m.leave(m.ClassDef(name=m.Name("ResponsesRequest")))
    def request_fields(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.hit("ResponsesRequest")
        return with_fields_and_validator(self, updated_node, RESPONSES_REQUEST_FIELDS,
                                         "_toolkit_tito_responses_request", f"{RUNTIME}.normalize_responses_request")


RESPONSE_MADE = m.SimpleStatementLine(body=[m.Assign(
    targets=[m.AssignTarget(m.Name("response"))],
    value=m.Call(func=m.Attribute(value=m.Name("ResponsesResponse"), attr=m.Name("from_request"))))])


RESPONSES_RENDERED = m.OneOf(
    # 0.30 and later: one render call
    m.SimpleStatementLine(body=[m.Assign(
        targets=[m.AssignTarget(m.Name("engine_inputs"))],
        value=m.List(elements=[m.Element(m.Attribute(value=m.Name("render_result"), attr=m.Name("engine_input")))]))]),
    # 0.24-0.29: `if self.use_harmony: messages, engine_inputs = ... else: messages, engine_inputs = ...`
    m.If(test=m.Attribute(value=m.Name("self"), attr=m.Name("use_harmony")),
         body=m.IndentedBlock(body=[m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(
             m.Tuple(elements=[m.Element(m.Name("messages")), m.Element(m.Name("engine_inputs"))]))])])]),
         orelse=m.Else()),
)


class ResponsesServingTransformer(AnchoredTransformer):
    RUNTIME, RUNTIME_ALIAS = PACKAGE, RUNTIME
    INSIDE = {"OpenAIServingResponses": frozenset({"_create_responses", "responses_full_generator",
                                                   "responses_stream_generator"})}
    ANCHORS = {
        "responses-rendered": "`engine_inputs = [render_result.engine_input]` (0.30 and later) or the `if "
                              "self.use_harmony:` that assigns `messages, engine_inputs` (0.24-0.29) in "
                              "OpenAIServingResponses._create_responses",
        "response-made": "`response = ResponsesResponse.from_request(...)` in "
                         "OpenAIServingResponses.responses_full_generator",
        "stream-event": "`yield event_data` (each event of the stream's processor) in "
                        "OpenAIServingResponses.responses_stream_generator",
    }

    @m.leave(m.IndentedBlock())
    @in_method("OpenAIServingResponses", "_create_responses")
    def check_rendered_prompt(self, original_node: cst.IndentedBlock,
                              updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return after_matching(self, updated_node, RESPONSES_RENDERED, "responses-rendered",
                              f"{RUNTIME}.check_prompt(request, engine_inputs, self.model_config.max_model_len)")

    @m.leave(m.IndentedBlock())
    @in_method("OpenAIServingResponses", "responses_full_generator")
    def response_token_ids(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        return after_matching(self, updated_node, RESPONSE_MADE, "response-made",
                              f"response = {RUNTIME}.with_response_token_ids(request, response, context, tokenizer)")

    @m.leave(m.SimpleStatementLine(body=[m.Expr(m.Yield(m.Name("event_data")))]))
    @in_method("OpenAIServingResponses", "responses_stream_generator")
    def item_done_token_ids(self, original_node: cst.SimpleStatementLine,
                            updated_node: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        """Each streamed event passes through the runtime, which puts ``token_ids`` on the item of an
        ``output_item.done`` (per-item ids, the same as on the final response's items)."""
        self.hit("stream-event")
        event = cst.parse_expression(f"{RUNTIME}.with_item_done_token_ids(request, event_data, context, tokenizer)")
        return self.marked_line(updated_node.with_changes(body=[cst.Expr(cst.Yield(event))]))
