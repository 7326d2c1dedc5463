"""The `toolkit verify` check ``multi-turn`` (needs the tito patch, on either engine): a three-turn
conversation with a tool call, through the prefix splice.

Turn one asks for the weather with a tool offered and named in ``tool_choice`` (when the model does not finish
the call, it is steered by a regex to a call in the format the server's tool-call parser reads: Llama 3's JSON
for llama3_json / llama3, else Hermes, the verify server's default); turn two sends the tool's result, turn
three a user question, each with the whole conversation as ``messages`` and the previous turn's
``prompt_token_ids + token_ids`` as ``prefix_token_ids``. Each turn's prompt must start with those ids
exactly, and the ids after them must carry the new message. The report also says whether plain re-templating
(the same request without the prefix) would have kept the earlier ids, and where it drifted.
"""

from __future__ import annotations

from typing import Any

from toolkit.verify.checks.check_types import MESSAGES, TOOLS, Check, CheckFailed, Target, first_difference
from toolkit.verify.client import ChatOutcome, HTTPStatusError

TOOL_RESULT = "sunny, 21 degrees"
FOLLOW_UP = "Thanks. And tomorrow?"
NAMED = {"type": "function", "function": {"name": "get_weather"}}
HERMES_CALL = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}\n</tool_call>'
# Llama 3.1's JSON call (its template renders a call so; vLLM's llama3_json and SGLang's llama3 parsers read it)
LLAMA3_CALL = r'\{"name": "get_weather", "parameters": \{"city": "Paris"\}\}'
STEERED_CALLS = {"llama3_json": LLAMA3_CALL, "llama3": LLAMA3_CALL}  # any other parser: HERMES_CALL
# get_weather with one city allowed: the named tool choice makes any model write this one short call.
WEATHER_TOOL = [{"type": "function", "function": {
    **TOOLS[0]["function"],
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris"]}},
                   "required": ["city"], "additionalProperties": False}}}]


def _assistant(outcome: ChatOutcome) -> dict[str, Any]:
    """The assistant message a client appends after a turn: the server's parsed reply."""
    message = (outcome.raw or {}).get("choices", [{}])[0].get("message") or {}
    out: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    for key in ("reasoning", "reasoning_content"):
        if message.get(key):
            out[key] = message[key]
    if message.get("tool_calls"):
        out["tool_calls"] = [{"id": call.get("id") or f"call_{i}", "type": "function", "function": call["function"]}
                             for i, call in enumerate(message["tool_calls"])]
    return out


def _turn(target: Target, messages: list[dict], prefix: list[int] | None, what: str, max_tokens: int = 16,
          **extra: Any) -> ChatOutcome:
    if prefix:
        extra["prefix_token_ids"] = prefix
    outcome = target.client.chat(messages, max_tokens=max_tokens, **extra)
    if outcome.prompt_token_ids is None or not outcome.choices or not outcome.choices[0].ids_seen:
        raise CheckFailed(f"{what}: the response has no prompt_token_ids / token_ids")
    return outcome


def _drift(target: Target, messages: list[dict], prefix: list[int], **extra: Any) -> str:
    """What plain re-templating (no prefix) does to the earlier ids."""
    plain = target.client.chat(messages, max_tokens=1, **extra).prompt_token_ids or []
    at = first_difference(prefix, plain[: len(prefix)])
    if at is None:
        return "plain re-templating keeps them"
    context = target.tokenizer.decode(prefix[max(0, at - 4): at + 4], skip_special_tokens=False)
    templated = target.tokenizer.decode(plain[max(0, at - 4): at + 4], skip_special_tokens=False)
    return f"plain re-templating drifts at token {at} of {len(prefix)} ({context!r} became {templated!r})"


def _grammar_crashes(target: Target) -> bool:
    """SGLang before 0.5.23 on CPU: its xgrammar backend raises in the scheduler on the first
    constrained token (``apply_vocab_mask_cpu`` missing) and the server exits; no constrained turn."""
    if target.engine != "sglang":
        return False
    try:
        info = target.client.http.get("/server_info").json()
        version = tuple(int(part) for part in str(info.get("version", "")).split(".")[:3])
    except Exception:  # no server info: do not risk it
        return True
    return info.get("device") == "cpu" and version < (0, 5, 23)


def check_multi_turn(target: Target) -> str:
    system, user = MESSAGES
    messages = [system, {"role": "user", "content": "What is the weather in Paris?"}]
    if _grammar_crashes(target):
        first = _turn(target, messages, None, "turn 1", tools=TOOLS)
        return _conversation(target, messages, first, {"tools": TOOLS}, "unsteered (SGLang's grammar backend "
                             "crashes on CPU before 0.5.23)")
    try:
        first = _turn(target, messages, None, "turn 1", max_tokens=48, tools=WEATHER_TOOL, tool_choice=NAMED)
        tools: dict[str, Any] = {"tools": WEATHER_TOOL}
        if not _assistant(first).get("tool_calls"):
            # The model did not finish a call (a tiny test model rambles in the arguments): steer it to the
            # format the server's tool-call parser reads (Hermes: the verify server's default). A reasoning parser
            # holds the grammar back until the model ends its reasoning, which a random model never does: thinking off
            # (Qwen3's template then closes the reasoning in the prompt; other templates ignore the switch), in
            # every turn, so that the templates stay the same.
            call = next((STEERED_CALLS[p] for p in target.parsers or () if p in STEERED_CALLS), HERMES_CALL)
            steer = {"structured_outputs": {"regex": call}} if target.engine == "vllm" else {"regex": call}
            tools["chat_template_kwargs"] = {"enable_thinking": False}
            first = _turn(target, messages, None, "turn 1", max_tokens=96, **tools, **steer)
    except HTTPStatusError as exc:
        if exc.status != 400:
            raise
        first = _turn(target, messages, None, "turn 1")  # the server parses no tool calls: text turns
        tools = {}
    return _conversation(target, messages, first, tools, "")


def _conversation(target: Target, messages: list[dict], first: ChatOutcome, tools: dict[str, Any], note: str) -> str:
    """Turns two and three after ``first``, each through the splice; the report."""
    reports = []
    reply = _assistant(first)
    called = bool(reply.get("tool_calls"))
    turns = [(first, reply)]
    if called:
        new = {"role": "tool", "tool_call_id": reply["tool_calls"][0]["id"], "content": TOOL_RESULT}
    else:
        new = {"role": "user", "content": f"The weather service says: {TOOL_RESULT}."}
    for number, new_message in ((2, new), (3, {"role": "user", "content": FOLLOW_UP})):
        previous, reply = turns[-1]
        messages = [*messages, reply, new_message]
        prefix = (previous.prompt_token_ids or []) + previous.choices[0].token_ids
        outcome = _turn(target, messages, prefix, f"turn {number}", **tools)
        prompt = outcome.prompt_token_ids or []
        if prompt[: len(prefix)] != prefix:
            at = first_difference(prefix, prompt[: len(prefix)])
            raise CheckFailed(f"turn {number}: the prompt does not start with the previous turn's ids (they part at "
                              f"token {at})", prefix=prefix, prompt=prompt, first_difference=at)
        rest = target.tokenizer.decode(prompt[len(prefix):], skip_special_tokens=False)
        if new_message["content"] not in rest:
            raise CheckFailed(f"turn {number}: the ids after the prefix do not carry the new {new_message['role']} "
                              f"message", rest=rest, message=new_message["content"])
        reports.append(f"turn {number}: prompt = {len(prefix)} ids of turn {number - 1} + {len(prompt) - len(prefix)} "
                       f"new; {_drift(target, messages, prefix, **tools)}")
        turns.append((outcome, _assistant(outcome)))
    head = "turn 1 called get_weather" if called else "turn 1 answered in text (no tool call)"
    if note:
        head += f" ({note})"
    return f"{head}; " + "; ".join(reports)


CHECKS = [
    Check("multi-turn", "three turns with a tool call through prefix_token_ids: each prompt starts with the "
          "previous turn's prompt + completion ids; reports where plain re-templating drifts",
          {"vllm": "tito", "sglang": "tito"}, check_multi_turn),
]
