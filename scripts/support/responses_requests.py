"""The scripted model's scenarios (from scripts/make_script_model.py), the requests that play them, and
the vLLM server arguments they need: shared by the responses-stream tests and
scripts/bench_responses_stream.py."""

from __future__ import annotations

from typing import Any

from .load import load_script

SERVER_ARGS = ["--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
               "--reasoning-parser", "qwen3"]

MODEL = load_script("make_script_model.py", "make_script_model")
SCENARIOS: dict[str, list[str]] = MODEL.SCENARIOS
TOOLS: list[dict] = MODEL.TOOLS

# Scenarios whose script starts with text: played with thinking off, as a Qwen3 user would (the
# qwen3 reasoning parser otherwise assumes generation starts inside reasoning).
THINKING_OFF = {name for name, tokens in SCENARIOS.items() if tokens[0] != "<think>"}


def request_body(model: str, scenario: str, extra: dict | None = None, stream: bool = False) -> dict:
    body: dict[str, Any] = {"model": model, "input": MODEL.selector(scenario), "tools": TOOLS,
                            "temperature": 0, "max_output_tokens": 64}
    if scenario in THINKING_OFF:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    body.update(extra or {})
    if stream:
        body["stream"] = True
    return body
