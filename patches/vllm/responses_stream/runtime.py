"""What the patched vLLM Responses serving calls (patch ``responses-stream``).

Runs inside the engine's API-server process. The patched ``serving.py`` calls these functions:

* :func:`simple_stream_events` -- the whole body of ``_process_simple_streaming_events``;
* :func:`final_output_items` -- the non-streaming output items (in place of
  ``_make_response_output_items``), made by the same state machine so they equal the streamed ones;
* :func:`terminal_event` -- ``response.completed`` or ``response.incomplete`` (or ``response.failed``);
* :func:`failed_event` -- ``response.failed`` for a generation error;
* :func:`is_terminal_event` -- where a background stream ends.

The ordering work is in :mod:`.machine`. vLLM's parsers are used for what they know: their markers
(``<think>``/``</think>``, ``<tool_call>``/``</tool_call>``, ...) and decoding a tool-call body that is
not JSON. A parser without start and end markers is used through its own ``parse_delta`` /
``parse``, whose typed deltas still go through our item machine (then the order is what that parser
can express). The harmony path never comes here.
"""

from __future__ import annotations

from typing import Any, AsyncIterator, Callable

from pydantic import BaseModel

from toolkit.patches.vllm.responses_stream.machine import ResponsesStream
from toolkit.patches.vllm.responses_stream.segmenter import Markers

PATCH_ID = "responses-stream"


TERMINAL_EVENTS = frozenset({"response.completed", "response.incomplete", "response.failed"})


def is_terminal_event(event: Any) -> bool:
    """Whether ``event`` ends a response stream (the background stream reader stops there)."""
    return getattr(event, "type", None) in TERMINAL_EVENTS


class LifecycleEvent(BaseModel):
    """``response.incomplete`` / ``response.failed``: a type, a sequence number and the response."""

    type: str
    sequence_number: int = -1
    response: Any


def _reasoning_markers(reasoning_parser: Any) -> tuple[str | None, str | None]:
    if reasoning_parser is None:
        return None, None
    start = getattr(reasoning_parser, "reasoning_start_str", None) or getattr(reasoning_parser, "start_token", None)
    end = getattr(reasoning_parser, "reasoning_end_str", None) or getattr(reasoning_parser, "end_token", None)
    return (start if isinstance(start, str) and start else None), (end if isinstance(end, str) and end else None)


def _tool_markers(tool_parser: Any) -> tuple[str | None, str | None]:
    if tool_parser is None:
        return None, None
    start = getattr(tool_parser, "tool_call_start_token", None)
    end = getattr(tool_parser, "tool_call_end_token", None)
    return (start if isinstance(start, str) and start else None), (end if isinstance(end, str) and end else None)


def _tool_choice_kind(request: Any, tool_parser: Any) -> str:
    """``none``, ``auto`` (parse the model's own markup) or ``forced`` (the parser's JSON path)."""
    choice = getattr(request, "tool_choice", None)
    if tool_parser is None or not getattr(request, "tools", None) or choice == "none":
        return "none"
    if choice in (None, "auto"):
        return "auto"
    if getattr(tool_parser, "supports_required_and_named", True):
        return "forced"
    return "auto"


def _starts_in_reasoning(parser: Any, markers: Markers, prompt_token_ids: Any) -> bool:
    """Whether generation starts inside reasoning, as the reasoning parser itself decides it.

    vLLM asks ``parser.is_reasoning_end(prompt)``: e.g. qwen3 in thinking mode waits for ``</think>``
    unless the prompt already closed reasoning, and a template that ends with ``<think>`` opens it.
    """
    if not markers.reasoning or prompt_token_ids is None or parser is None:
        return False
    try:
        return not parser.is_reasoning_end(list(prompt_token_ids))
    except Exception:
        return False


def make_stream(request: Any, parser: Any, tokenizer: Any, prompt_token_ids: Any) -> tuple[ResponsesStream, bool]:
    """The state machine for one request, and whether it reads raw text (else the parser's deltas)."""
    tools = getattr(request, "tools", None) or []
    try:
        from vllm.entrypoints.openai.responses.utils import (
            build_responses_tool_call_name_map,
            custom_tool_names,
            resolve_responses_tool_call_name,
        )
    except ImportError:  # vLLM 0.30/0.31: no tool namespaces and no custom tools; a name is itself
        def resolve_name(name: str) -> tuple[str, str | None]:
            return name, None

        custom_names: frozenset[str] = frozenset()
    else:
        name_map = build_responses_tool_call_name_map(tools)

        def resolve_name(name: str) -> tuple[str, str | None]:
            resolved = resolve_responses_tool_call_name(name, tool_call_name_map=name_map)
            return resolved.name, getattr(resolved, "namespace", None)

        custom_names = custom_tool_names(tools)

    reasoning_parser = getattr(parser, "reasoning_parser", None) if parser is not None else None
    tool_parser = getattr(parser, "tool_parser", None) if parser is not None else None
    tool_choice = _tool_choice_kind(request, tool_parser)
    r_start, r_end = _reasoning_markers(reasoning_parser)
    t_start, t_end = _tool_markers(tool_parser)
    raw_text = (
        parser is None
        or ((reasoning_parser is None or (r_start and r_end))
            and (tool_choice == "none" or (tool_choice == "auto" and t_start and t_end)))
    )
    markers = Markers(r_start, r_end, *((t_start, t_end) if tool_choice == "auto" else (None, None)))

    def decode_with_parser(body: str) -> list[tuple[str, str]] | None:
        if tool_parser is None:  # no parser, no tool markers: never asked (decode_tool is None then)
            return None
        info = tool_parser.extract_tool_calls(f"{t_start}{body}{t_end}", request)
        if info is None or not info.tools_called:
            return None
        return [(call.function.name, call.function.arguments) for call in info.tool_calls]

    decode_tool = decode_with_parser if raw_text and markers.tools else None

    stream = ResponsesStream(
        markers if raw_text else Markers(),
        start_in_reasoning=bool(raw_text) and _starts_in_reasoning(parser, markers, prompt_token_ids),
        include_reasoning=getattr(request, "include_reasoning", True),
        trim=parser is not None,
        resolve_name=resolve_name,
        custom_tool_names=custom_names,
        decode_tool=decode_tool,
        parallel_tool_calls=getattr(request, "parallel_tool_calls", True) is not False,
    )
    return stream, bool(raw_text)


def _logprobs(serving: Any, request: Any, output: Any, tokenizer: Any, parser: Any) -> list | None:
    if not request.is_include_output_logprobs() or not output.logprobs:
        return None
    if not request.include_reasoning and parser is not None:
        return None  # upstream hides per-token metadata when reasoning is hidden
    return serving._create_response_logprobs(
        token_ids=output.token_ids, logprobs=output.logprobs, tokenizer=tokenizer,
        top_logprobs=request.top_logprobs,
    )


async def simple_stream_events(
    serving: Any,
    request: Any,
    result_generator: AsyncIterator[Any],
    context: Any,
    tokenizer: Any,
    number: Callable[[Any], Any],
) -> AsyncIterator[Any]:
    """The events of the simple (non-harmony) streaming path, numbered by ``number``."""
    stream: ResponsesStream | None = None
    raw_text = True
    parser = context.response_parser
    finish_reason: str | None = None
    try:
        async for ctx in result_generator:
            if ctx.last_output is None or not ctx.last_output.outputs:
                continue
            output = ctx.last_output.outputs[0]
            if stream is None:
                stream, raw_text = make_stream(request, parser, tokenizer, ctx.last_output.prompt_token_ids)
                context.streamed_output_items = stream.items
            serving._raise_if_error(output.finish_reason, request.request_id)
            finish_reason = output.finish_reason
            logprobs = _logprobs(serving, request, output, tokenizer, parser)
            if raw_text:
                events = stream.feed(output.text, logprobs)
            else:
                delta = parser.parse_delta(
                    delta_text=output.text,
                    delta_token_ids=list(output.token_ids),
                    request=request,
                    prompt_token_ids=ctx.last_output.prompt_token_ids,
                    finished=output.finish_reason is not None,
                )
                events = stream.feed_parsed(delta.reasoning, delta.content, delta.tool_calls, logprobs) if delta else []
            for event in events:
                yield number(event)
    except Exception:  # GenerationError and the like; never a cancellation or a closed stream
        if stream is not None:  # close what is open, so that response.failed follows a whole item
            for event in stream.finish("error"):
                yield number(event)
        raise
    if stream is None:
        stream, raw_text = make_stream(request, parser, tokenizer, None)
        context.streamed_output_items = stream.items
    for event in stream.finish(finish_reason):
        yield number(event)
    context.streamed_output_items = stream.items


def final_output_items(serving: Any, request: Any, final_res: Any, final_output: Any, tokenizer: Any,
                       context: Any) -> list[Any]:
    """The non-streaming output items: the whole output through the same state machine."""
    streamed = getattr(context, "streamed_output_items", None)
    if streamed is not None:
        # A stream's final response: its items are the streamed ones (ids included). vLLM 0.32+ take
        # them itself before this call; 0.30/0.31 always re-parse, which would mint new item ids.
        return list(streamed)
    parser = context.response_parser
    stream, raw_text = make_stream(request, parser, tokenizer, getattr(final_res, "prompt_token_ids", None))
    logprobs = _logprobs(serving, request, final_output, tokenizer, parser)
    if raw_text:
        stream.feed(final_output.text, logprobs)
    else:
        reasoning, content, tool_calls = parser.parse(
            final_output.text, request, enable_auto_tools=serving.enable_auto_tools,
            model_output_token_ids=final_output.token_ids,
        )
        stream.feed_parsed(reasoning, content, tool_calls, logprobs)
    stream.finish(final_output.finish_reason)
    return stream.items


def terminal_event(final_response: Any, request: Any, sampling_params: Any, model_name: str, created_time: int,
                   context: Any) -> Any:
    """``response.completed``, ``response.incomplete`` or (for an error response) ``response.failed``."""
    from vllm.entrypoints.openai.responses.protocol import ResponseCompletedEvent, ResponsesResponse

    if not isinstance(final_response, ResponsesResponse):  # an ErrorResponse
        error = getattr(final_response, "error", None)
        message = getattr(error, "message", None) or str(final_response)
        return failed_event(request, sampling_params, model_name, created_time, context, RuntimeError(message))
    if final_response.status == "incomplete":
        try:  # vLLM >= 0.33: its own readers (the background stream's replay) stop on this class, not on the type
            from vllm.entrypoints.openai.responses.protocol import ResponseIncompleteEvent
        except ImportError:
            return LifecycleEvent(type="response.incomplete", response=final_response)
        return ResponseIncompleteEvent(type="response.incomplete", sequence_number=-1, response=final_response)
    return ResponseCompletedEvent(type="response.completed", sequence_number=-1, response=final_response)


def failed_event(request: Any, sampling_params: Any, model_name: str, created_time: int, context: Any,
                 error: BaseException) -> LifecycleEvent:
    """``response.failed`` with the error, carrying the items finished before it."""
    from vllm.entrypoints.openai.responses.protocol import ResponsesResponse

    response = ResponsesResponse.from_request(
        request, sampling_params, model_name=model_name, created_time=created_time,
        output=list(getattr(context, "streamed_output_items", None) or []), status="failed", usage=None,
    ).model_dump(mode="json", by_alias=True)
    response["error"] = {"code": "server_error", "message": str(error) or type(error).__name__}
    return LifecycleEvent(type="response.failed", response=response)
