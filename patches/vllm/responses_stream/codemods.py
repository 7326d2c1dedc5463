"""The edits to vLLM's ``entrypoints/openai/responses/serving.py`` (0.32.x and 0.33.x).

Each edit is a call into :mod:`toolkit.patches.vllm.responses_stream.runtime`, marked
``# toolkit:responses-stream``; the harmony path is left as it is.

1. an import of the runtime, after the module's first import (the codemod base's one rule);
2. ``OpenAIServingResponses._process_simple_streaming_events``: its body becomes one loop over
   ``runtime.simple_stream_events``;
3. in ``responses_full_generator``, ``output = self._make_response_output_items(...)`` (the
   non-streaming simple path) becomes ``runtime.final_output_items(...)``;
4. in ``responses_stream_generator``, right after ``final_response = await
   self.responses_full_generator(...)``, the simple path yields ``runtime.terminal_event(...)`` and
   returns (``response.incomplete`` on 0.32 too, ``response.failed`` for an error response);
5. in the same method, ``except GenerationError as e:`` yields ``runtime.failed_event(...)`` on the
   simple path, instead of an ``error`` event;
6. in ``responses_background_stream_generator``, the test for the last event becomes
   ``runtime.is_terminal_event(event)``, so a background stream also ends at ``response.incomplete``
   and ``response.failed`` (0.32 stops only at ``response.completed``, 0.33 not at ``failed``).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer, in_method, self_call

CLASS = "OpenAIServingResponses"
RUNTIME = "_toolkit_rs"


FINAL_RESPONSE = m.SimpleStatementLine(body=[m.Assign(
    targets=[m.AssignTarget(m.Name("final_response"))],
    value=m.Await(expression=self_call("responses_full_generator")),
)])


class ServingTransformer(AnchoredTransformer):
    """``OpenAIServingResponses``: the edits 1-6 above, in one pass over the file."""

    RUNTIME, RUNTIME_ALIAS = "toolkit.patches.vllm.responses_stream", RUNTIME
    INSIDE = {CLASS: frozenset({"_process_simple_streaming_events", "responses_full_generator",
                                "responses_stream_generator", "responses_background_stream_generator"})}
    ANCHORS = {
        f"{CLASS}._process_simple_streaming_events": "the simple (non-harmony) streaming event loop",
        "responses_full_generator: output = self._make_response_output_items(...)":
            "the non-streaming output items of the simple path",
        "responses_stream_generator: final_response = await self.responses_full_generator(...)":
            "where the terminal event is made",
        "responses_stream_generator: except GenerationError": "the streaming error handler",
        "responses_background_stream_generator: if getattr(event, \"type\", ...) ...":
            "the test that ends a background stream",
    }

    @m.leave(m.FunctionDef(name=m.Name("_process_simple_streaming_events")))
    @m.call_if_inside(m.ClassDef(name=m.Name(CLASS)))
    def one_loop(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self.hit(f"{CLASS}._process_simple_streaming_events")
        loop = self.marked_statement(
            f"async for event in {RUNTIME}.simple_stream_events(\n"
            "    self, request, result_generator, context, tokenizer, _increment_sequence_number_and_return\n"
            "):\n"
            "    yield event\n"
        )
        return updated_node.with_changes(body=updated_node.body.with_changes(body=[loop]))

    @m.leave(m.SimpleStatementLine(body=[
        m.Assign(targets=[m.AssignTarget(m.Name("output"))], value=self_call("_make_response_output_items"))]))
    @in_method(CLASS, "responses_full_generator")
    def final_items(self, original_node: cst.SimpleStatementLine,
                    updated_node: cst.SimpleStatementLine) -> cst.BaseStatement:
        self.hit("responses_full_generator: output = self._make_response_output_items(...)")
        return self.marked_statement(
            f"output = {RUNTIME}.final_output_items(\n"
            "    self, request, final_res, final_output, tokenizer, context\n"
            ")\n"
        )

    @m.leave(m.IndentedBlock())
    @in_method(CLASS, "responses_stream_generator")
    def terminal_event(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        terminal = self.marked_statement(
            "if not self.use_harmony:\n"
            "    yield _increment_sequence_number_and_return(\n"
            f"        {RUNTIME}.terminal_event(\n"
            "            final_response, request, sampling_params, model_name, created_time, context\n"
            "        )\n"
            "    )\n"
            "    return\n"
        )
        body = self.around_each(updated_node.body, FINAL_RESPONSE,
                                "responses_stream_generator: final_response = await self.responses_full_generator(...)",
                                [terminal])
        return updated_node.with_changes(body=body)

    @m.leave(m.ExceptHandler(type=m.Name("GenerationError"), name=m.AsName(name=m.Name("e"))))
    @in_method(CLASS, "responses_stream_generator")
    def failed_event(self, original_node: cst.ExceptHandler, updated_node: cst.ExceptHandler) -> cst.ExceptHandler:
        self.hit("responses_stream_generator: except GenerationError")
        guard = self.marked_statement(
            "if not self.use_harmony:\n"
            "    yield _increment_sequence_number_and_return(\n"
            f"        {RUNTIME}.failed_event(request, sampling_params, model_name, created_time, context, e)\n"
            "    )\n"
            "    return\n"
        )
        body = updated_node.body
        return updated_node.with_changes(body=body.with_changes(body=[guard, *body.body]))

    @m.leave(m.If(test=m.Comparison(left=m.Call(
        func=m.Name("getattr"), args=[m.Arg(m.Name("event")), m.Arg(m.SimpleString()), m.ZeroOrMore()]))))
    @in_method(CLASS, "responses_background_stream_generator")
    def ends_at_any_terminal_event(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        self.hit("responses_background_stream_generator: if getattr(event, \"type\", ...) ...")
        test = cst.parse_expression(f"{RUNTIME}.is_terminal_event(event)")
        block = cst.ensure_type(updated_node.body, cst.IndentedBlock)
        return updated_node.with_changes(test=test, body=self.marked_header(block))
