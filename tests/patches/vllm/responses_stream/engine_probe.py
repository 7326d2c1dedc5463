"""Run inside a vLLM venv (by test_runtime.py): the runtime with vLLM's real parsers, no server.

    python engine_probe.py MODEL_DIR  ->  one JSON object through tests/harness/channel.py

Feeds the scripted model's scenarios, token by token, through ``runtime.simple_stream_events`` and
the whole output through ``runtime.final_output_items``, with the real hermes + qwen3 parsers and a
real ``ResponsesRequest``; also a generation error, ``response.incomplete``, and a tool parser
without markers (the typed-delta path).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO))

from toolkit.patches.vllm.responses_stream import runtime  # noqa: E402
from scripts.support import responses_requests  # noqa: E402
from tests.patches.vllm.responses_stream import support  # noqa: E402


def main(model_dir: str) -> dict:
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest, ResponsesResponse
    from vllm.exceptions import GenerationError
    from vllm.parser import ParserManager
    from vllm.sampling_params import SamplingParams
    from vllm.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(model_dir)
    out: dict = {"cases": {}}

    def make_parser(tool_parser: str, request):
        cls = ParserManager.get_parser(tool_parser_name=tool_parser, reasoning_parser_name="qwen3",
                                       enable_auto_tools=True, model_name="m", is_harmony=False, tokenizer=tokenizer)
        return cls(tokenizer, request.tools, chat_template_kwargs=request.chat_template_kwargs or {},
                   model_config=None)

    class Serving:
        enable_auto_tools = True

        def _raise_if_error(self, finish_reason, request_id):
            if finish_reason == "error":
                raise GenerationError("Internal server error")

    def play(name: str, tokens: list[str], finish: str = "stop", tool_parser: str = "hermes",
             thinking: bool | None = None) -> dict:
        body = responses_requests.request_body("m", name if name in responses_requests.SCENARIOS else "text_only")
        if thinking is not None:
            body["chat_template_kwargs"] = {"enable_thinking": thinking}
        request = ResponsesRequest(**{**body, "stream": True})
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": body["input"]}], tokenize=True,
                                               add_generation_prompt=True)
        prompt = list(prompt["input_ids"] if isinstance(prompt, dict) else prompt)
        ids = [tokenizer.encode(t, add_special_tokens=False) for t in tokens]

        async def results():
            for i, (text, tid) in enumerate(zip(tokens, ids)):
                last = i == len(tokens) - 1
                output = SimpleNamespace(text=text, token_ids=tid, logprobs=None, finish_reason=finish if last else None)
                yield SimpleNamespace(last_output=SimpleNamespace(outputs=[output], prompt_token_ids=prompt))

        context = SimpleNamespace(response_parser=make_parser(tool_parser, request), streamed_output_items=None)
        events, error = [], None

        async def run():
            nonlocal error
            try:
                async for event in runtime.simple_stream_events(Serving(), request, results(), context, tokenizer,
                                                                lambda e: e):
                    events.append(event.model_dump(mode="json"))
            except GenerationError as exc:
                error = exc

        asyncio.run(run())
        params = SamplingParams(max_tokens=64)
        items = [i.model_dump(mode="json") for i in context.streamed_output_items or []]
        result: dict = {"events": events, "items": items}
        if error is not None:
            failed = runtime.failed_event(request, params, "m", 0, context, error).model_dump(mode="json")
            result["terminal"] = failed
            return result
        status = "incomplete" if finish == "length" else "completed"
        response = ResponsesResponse.from_request(request, params, model_name="m", created_time=0,
                                                  output=context.streamed_output_items, status=status)
        result["terminal"] = runtime.terminal_event(response, request, params, "m", 0, context).model_dump(mode="json")
        whole = SimpleNamespace(text="".join(tokens), token_ids=[t for piece in ids for t in piece], logprobs=None,
                                finish_reason=finish)
        nonstream_context = SimpleNamespace(response_parser=make_parser(tool_parser, request))
        final = runtime.final_output_items(Serving(), request, SimpleNamespace(prompt_token_ids=prompt), whole,
                                           tokenizer, nonstream_context)
        result["nonstream"] = [i.model_dump(mode="json") for i in final]
        return result

    for case, scenario, extra in support.CASES:
        tokens = responses_requests.SCENARIOS[scenario]
        finish = "stop"
        if "max_output_tokens" in extra:
            tokens, finish = tokens[: extra["max_output_tokens"]], "length"
        out["cases"][case] = play(scenario, tokens, finish)
    out["cases"]["generation_error"] = play("reason_text_tools", responses_requests.SCENARIOS["reason_text_tools"][:14], "error")
    # pythonic has no start/end markers: its own parse_delta / parse feed the item machine
    out["cases"]["markerless_parser"] = play(
        "text_only", ["[get_weather(", 'city="Oslo"', ")]"], tool_parser="pythonic", thinking=False)
    return out


if __name__ == "__main__":
    from tests.harness.channel import write_result

    write_result(main(sys.argv[1]))
