"""The `toolkit verify` check ``responses-stream`` (needs the vLLM responses-stream patch)."""

from __future__ import annotations

from toolkit.verify.grammar import check_events, compare_outputs
from toolkit.verify.checks.check_types import MESSAGES, TOOLS, Check, CheckFailed, Target
from toolkit.verify.client import HTTPStatusError


def check_responses_stream(target: Target) -> str:
    """/v1/responses streamed: the events follow the OpenAI grammar (checked by a state machine over
    the events, toolkit.verify.grammar), the terminal response holds exactly the
    streamed items, and the non-streaming response to the same greedy request has the same items.
    Once cut by max_output_tokens (the incomplete path) and once run to a longer limit, with tools
    offered when the server parses tool calls."""
    user = MESSAGES[-1]["content"]
    cases = [("cut by max_output_tokens", {"input": user, "max_output_tokens": 8}),
             ("tools offered", {"input": user, "max_output_tokens": 48, "tools": [
                 {"type": "function", **TOOLS[0]["function"]}]})]
    seen = []
    for what, request in cases:
        body = {"temperature": 0, **request}
        try:
            events = target.client.responses(body, stream=True)
        except HTTPStatusError as exc:
            if "tools" in body and exc.status == 400 and exc.mentions("tool"):
                seen.append(f"{what}: skipped, the server parses no tool calls")
                continue
            raise
        problems = check_events(events)
        if problems:
            raise CheckFailed(f"responses stream ({what}): {len(problems)} grammar problem(s): {problems[0]}",
                              problems=problems, event_types=[e.get("type") for e in events])
        final = events[-1].get("response") or {}
        plain = target.client.responses(body, stream=False)
        differences = compare_outputs(final.get("output") or [], plain.get("output") or [], ignore_ids=True)
        if differences or final.get("status") != plain.get("status"):
            raise CheckFailed(f"responses ({what}): the streamed items differ from the non-streaming response's",
                              differences=differences, stream_status=final.get("status"),
                              nonstream_status=plain.get("status"))
        seen.append(f"{what}: {len(events)} events, {final.get('status')}")
    return "; ".join(seen)


CHECKS = [
    Check("responses-stream", "/v1/responses: streamed events follow the OpenAI grammar, same items as non-streaming",
          {"vllm": "responses-stream"}, check_responses_stream),
]
