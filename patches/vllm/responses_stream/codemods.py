"""The edits to vLLM's ``entrypoints/openai/responses/serving.py`` (0.32.x and 0.33.x).

Each edit is a call into :mod:`toolkit.patches.vllm.responses_stream.runtime`, marked
``# toolkit:responses-stream``; the harmony path is left as it is.

1. an import of the runtime, after the module's last top-level import;
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

from toolkit.codemod import AnchoredTransformer

CLASS = "OpenAIServingResponses"
RUNTIME = "_toolkit_rs"


def _self_call(method: str) -> m.Call:
    return m.Call(func=m.Attribute(value=m.Name("self"), attr=m.Name(method)))


class _InServing(AnchoredTransformer):
    """Tracks the enclosing ``OpenAIServingResponses`` method."""

    def __init__(self, context) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context)
        self._classes: list[str] = []
        self._functions: list[str] = []

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._classes.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self._classes.pop()
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._functions.append(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self._functions.pop()
        return updated_node

    def in_method(self, name: str) -> bool:
        return self._classes[-1:] == [CLASS] and self._functions[:1] == [name]


class ImportRuntime(AnchoredTransformer):
    ANCHORS = {"module imports": "the last top-level import of serving.py"}

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        body = list(updated_node.body)
        last = None
        for position, statement in enumerate(body):
            if m.matches(statement, m.SimpleStatementLine(body=[m.OneOf(m.Import(), m.ImportFrom())])):
                last = position
        if last is None:
            return updated_node
        self.hit("module imports")
        line = cst.parse_statement(
            f"from toolkit.patches.vllm.responses_stream import runtime as {RUNTIME}  {self.marker}\n"
        )
        body.insert(last + 1, line)
        return updated_node.with_changes(body=body)


class ReplaceSimpleStreaming(_InServing):
    ANCHORS = {
        f"{CLASS}._process_simple_streaming_events": "the simple (non-harmony) streaming event loop",
    }

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        matched = updated_node.name.value == "_process_simple_streaming_events" and self._classes[-1:] == [CLASS] \
            and len(self._functions) == 1
        result = super().leave_FunctionDef(original_node, updated_node)
        if not matched:
            return result
        self.hit(f"{CLASS}._process_simple_streaming_events")
        loop = cst.parse_statement(
            f"async for event in {RUNTIME}.simple_stream_events(  {self.marker}\n"
            "    self, request, result_generator, context, tokenizer, _increment_sequence_number_and_return\n"
            "):\n"
            "    yield event\n"
        )
        return result.with_changes(body=result.body.with_changes(body=[loop]))


class NonStreamingItems(_InServing):
    ANCHORS = {
        "responses_full_generator: output = self._make_response_output_items(...)":
            "the non-streaming output items of the simple path",
    }

    def leave_SimpleStatementLine(
        self, original_node: cst.SimpleStatementLine, updated_node: cst.SimpleStatementLine
    ) -> cst.SimpleStatementLine:
        if not self.in_method("responses_full_generator"):
            return updated_node
        if not m.matches(updated_node, m.SimpleStatementLine(
            body=[m.Assign(targets=[m.AssignTarget(m.Name("output"))], value=_self_call("_make_response_output_items"))]
        )):
            return updated_node
        self.hit("responses_full_generator: output = self._make_response_output_items(...)")
        return cst.parse_statement(
            f"output = {RUNTIME}.final_output_items(  {self.marker}\n"
            "    self, request, final_res, final_output, tokenizer, context\n"
            ")\n"
        )  # type: ignore[return-value]


class TerminalEvents(_InServing):
    ANCHORS = {
        "responses_stream_generator: final_response = await self.responses_full_generator(...)":
            "where the terminal event is made",
        "responses_stream_generator: except GenerationError": "the streaming error handler",
    }

    def leave_IndentedBlock(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        if not self.in_method("responses_stream_generator"):
            return updated_node
        final = m.SimpleStatementLine(body=[m.Assign(
            targets=[m.AssignTarget(m.Name("final_response"))],
            value=m.Await(expression=_self_call("responses_full_generator")),
        )])
        body: list[cst.BaseStatement] = []
        for statement in updated_node.body:
            body.append(statement)
            if m.matches(statement, final):
                self.hit("responses_stream_generator: final_response = await self.responses_full_generator(...)")
                body.append(cst.parse_statement(
                    f"if not self.use_harmony:  {self.marker}\n"
                    "    yield _increment_sequence_number_and_return(\n"
                    f"        {RUNTIME}.terminal_event(\n"
                    "            final_response, request, sampling_params, model_name, created_time, context\n"
                    "        )\n"
                    "    )\n"
                    "    return\n"
                ))
        return updated_node.with_changes(body=body)

    def leave_ExceptHandler(self, original_node: cst.ExceptHandler, updated_node: cst.ExceptHandler) -> cst.ExceptHandler:
        if not self.in_method("responses_stream_generator"):
            return updated_node
        if not m.matches(updated_node, m.ExceptHandler(type=m.Name("GenerationError"),
                                                       name=m.AsName(name=m.Name("e")))):
            return updated_node
        self.hit("responses_stream_generator: except GenerationError")
        guard = cst.parse_statement(
            f"if not self.use_harmony:  {self.marker}\n"
            "    yield _increment_sequence_number_and_return(\n"
            f"        {RUNTIME}.failed_event(request, sampling_params, model_name, created_time, context, e)\n"
            "    )\n"
            "    return\n"
        )
        body = updated_node.body
        return updated_node.with_changes(body=body.with_changes(body=[guard, *body.body]))


class BackgroundStreamEnd(_InServing):
    ANCHORS = {
        "responses_background_stream_generator: if getattr(event, \"type\", ...) ...":
            "the test that ends a background stream",
    }

    def leave_If(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        if not self.in_method("responses_background_stream_generator"):
            return updated_node
        if not m.matches(updated_node.test, m.Comparison(left=m.Call(
            func=m.Name("getattr"), args=[m.Arg(m.Name("event")), m.Arg(m.SimpleString()), m.ZeroOrMore()],
        ))):
            return updated_node
        self.hit("responses_background_stream_generator: if getattr(event, \"type\", ...) ...")
        test = cst.parse_expression(f"{RUNTIME}.is_terminal_event(event)")
        body = updated_node.body
        header = body.header.with_changes(comment=cst.Comment(self.marker), whitespace=cst.SimpleWhitespace("  "))
        return updated_node.with_changes(test=test, body=body.with_changes(header=header))
