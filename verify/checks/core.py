"""The core `toolkit verify` checks: the token-id contract every patched engine keeps (token ids out;
the tito patch's input ids in)."""

from __future__ import annotations

import concurrent.futures
from typing import Any

from toolkit.verify.checks.check_types import (MESSAGES, OTHER_MESSAGES, TOOLS, Check, CheckFailed, CheckSkipped, Target,
                                               decoded, ids_evidence)
from toolkit.verify.accounting import Unaccounted, account_either
from toolkit.verify.client import ChatOutcome, HTTPStatusError

# What decode(token_ids) may differ from the parsed fields by: the engine strips special tokens' text
# (skip_special_tokens; or keeps it all where a parser asks it to for the request), and each parser the
# server runs strips its markers and trims whitespace (toolkit.verify.accounting.RULES, per parser).
# Anything else is a mismatch.
ROUND_TRIP_ALLOWANCE = "special tokens decode to nothing; the parsers' markers and trimmed whitespace"


def _require_ids(outcome: ChatOutcome, what: str) -> None:
    if outcome.prompt_token_ids is None:
        raise CheckFailed(f"{what}: no prompt_token_ids in the response")
    for index, choice in outcome.choices.items():
        if not choice.ids_seen:
            raise CheckFailed(f"{what}: choice {index} has no token_ids")


def _decode_matches(target: Target, outcome: ChatOutcome, what: str) -> list[str]:
    """Every choice's ids, decoded, are its reasoning + content + tool calls as the parsers split them;
    returns what was matched loosely or left undecided (the check's report names it)."""
    notes: list[str] = []
    for index, choice in sorted(outcome.choices.items()):
        kept = target.tokenizer.decode(choice.token_ids, skip_special_tokens=False)
        try:
            found = account_either(decoded(target, choice.token_ids), kept, choice.split, target.parsers)
        except Unaccounted as exc:
            raise CheckFailed(f"{what}: choice {index}: {exc.detail}", token_ids=choice.token_ids,
                              **exc.evidence) from None
        notes += [f"{what}: choice {index}: {note}" for note in found]
    return notes


def _fields(outcome: ChatOutcome) -> str:
    """Which fields the first choice's ids went to (the pass report names them)."""
    split = outcome.choices[0].split
    named = [f"{name} ({'whitespace only' if not text.strip() else f'{len(text)} chars'})"
             for name, text in (("reasoning", split.reasoning), ("content", split.content)) if text]
    if split.tool_calls:
        named.append(f"{len(split.tool_calls)} tool call(s)")
    return " + ".join(named) or "no text"


def _with_notes(report: str, notes: list[str]) -> str:
    return report + ("; not decided or matched loosely: " + "; ".join(dict.fromkeys(notes)) if notes else "")


def check_nonstream_decode(target: Target) -> str:
    outcome = target.client.chat(MESSAGES)
    _require_ids(outcome, "non-streaming")
    notes = _decode_matches(target, outcome, "non-streaming")
    ids = outcome.choices[0].token_ids
    return _with_notes(f"{len(ids)} completion ids decode to {_fields(outcome)} ({ROUND_TRIP_ALLOWANCE})", notes)


def check_stream_decode(target: Target) -> str:
    outcome = target.client.chat(MESSAGES, stream=True)
    _require_ids(outcome, "streaming")
    if not outcome.prompt_ids_on_first_chunk:
        raise CheckFailed("streaming: prompt_token_ids did not arrive on the first chunk")
    notes = _decode_matches(target, outcome, "streaming")
    return _with_notes(f"{outcome.chunks} chunks; concatenated ids decode to the concatenated deltas "
                       f"({_fields(outcome)})", notes)


def _parity(target: Target, stream: ChatOutcome, plain: ChatOutcome, what: str) -> None:
    if stream.prompt_token_ids != plain.prompt_token_ids:
        raise CheckFailed(f"{what}: prompt ids differ", **ids_evidence(
            "stream_prompt_ids", stream.prompt_token_ids or [], "nonstream_prompt_ids", plain.prompt_token_ids or []))
    if set(stream.choices) != set(plain.choices):
        raise CheckFailed(f"{what}: choice indexes differ: {sorted(stream.choices)} vs {sorted(plain.choices)}")
    for index in sorted(plain.choices):
        a, b = stream.choices[index].token_ids, plain.choices[index].token_ids
        if a != b:
            raise CheckFailed(f"{what}: choice {index}: completion ids differ",
                              **ids_evidence("stream_ids", a, "nonstream_ids", b))


def check_stream_vs_nonstream(target: Target) -> str:
    plain = target.client.chat(MESSAGES)
    stream = target.client.chat(MESSAGES, stream=True)
    _require_ids(plain, "non-streaming")
    _require_ids(stream, "streaming")
    _parity(target, stream, plain, "stream vs non-stream")
    return f"same {len(plain.prompt_token_ids or [])} prompt ids and {len(plain.choices[0].token_ids)} completion ids"


def check_tools(target: Target) -> str:
    """With tools offered, the tool-call parser holds text back while streaming: no id may be lost."""
    try:
        plain = target.client.chat(MESSAGES, tools=TOOLS)
    except HTTPStatusError as exc:
        if exc.status == 400 and exc.mentions("tool"):
            raise CheckSkipped(f"the server has no tool-call parser enabled ({str(exc)[:160]})") from exc
        raise
    stream = target.client.chat(MESSAGES, tools=TOOLS, stream=True)
    _require_ids(plain, "tools, non-streaming")
    _require_ids(stream, "tools, streaming")
    _parity(target, stream, plain, "tools offered")
    notes = _decode_matches(target, plain, "tools, non-streaming") + _decode_matches(target, stream, "tools, streaming")
    return _with_notes(f"tools offered: stream ids equal non-stream ids; both decode to {_fields(plain)}", notes)


def check_prompt_template(target: Target) -> str:
    outcome = target.client.chat(MESSAGES)
    _require_ids(outcome, "non-streaming")
    local = target.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    if hasattr(local, "input_ids"):
        local = local["input_ids"]
    local = list(local)
    if outcome.prompt_token_ids != local:
        raise CheckFailed("prompt_token_ids differ from the local chat-template encoding",
                          **ids_evidence("server_prompt_ids", outcome.prompt_token_ids or [], "local_prompt_ids", local))
    return f"{len(local)} prompt ids equal the local chat-template encoding"


def check_input_ids_round_trip(target: Target) -> str:
    plain = target.client.chat(MESSAGES)
    _require_ids(plain, "non-streaming")
    # Other messages beside the ids: a server that ignored input_ids would answer those instead.
    again = target.client.chat(OTHER_MESSAGES, input_ids=plain.prompt_token_ids)
    _require_ids(again, "input_ids")
    if again.prompt_token_ids != plain.prompt_token_ids:
        raise CheckFailed("input_ids: echoed prompt ids differ from those sent", **ids_evidence(
            "sent", plain.prompt_token_ids or [], "echoed", again.prompt_token_ids or []))
    a, b = again.choices[0].token_ids, plain.choices[0].token_ids
    if a != b:
        raise CheckFailed("input_ids: completion differs from the templated request's",
                          **ids_evidence("input_ids_completion", a, "messages_completion", b))
    return "the same turn sent as input_ids gives the same completion"


def check_concurrency(target: Target) -> str:
    """n=2, and 16 concurrent mixed requests (stream and not, two prompts): each passes the checks
    above, and each equals the same request sent alone."""
    solo = {}
    for key, messages in (("a", MESSAGES), ("b", OTHER_MESSAGES)):
        solo[key] = target.client.chat(messages)
        _require_ids(solo[key], f"solo {key}")
    # Engines may refuse n > 1 with greedy decoding (vLLM does): then sample with a fixed seed,
    # which is just as deterministic across the two requests.
    sampling: dict[str, Any] = {}
    try:
        n2 = target.client.chat(MESSAGES, n=2)
    except HTTPStatusError as exc:
        if exc.status != 400:
            raise
        sampling = {"temperature": 1.0, "seed": 1234}
        n2 = target.client.chat(MESSAGES, n=2, **sampling)
    n2_stream = target.client.chat(MESSAGES, n=2, stream=True, **sampling)
    notes: list[str] = []
    for outcome, what in ((n2, "n=2"), (n2_stream, "n=2 streaming")):
        _require_ids(outcome, what)
        notes += _decode_matches(target, outcome, what)
        if sorted(outcome.choices) != [0, 1]:
            raise CheckFailed(f"{what}: expected choices 0 and 1, got {sorted(outcome.choices)}")
    _parity(target, n2_stream, n2, "n=2")
    jobs = [(("a", "b")[i % 2], bool(i // 2 % 2)) for i in range(16)]
    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        futures = [pool.submit(target.client.chat, MESSAGES if key == "a" else OTHER_MESSAGES, stream=stream)
                   for key, stream in jobs]
        outcomes = [f.result() for f in futures]
    for i, ((key, stream), outcome) in enumerate(zip(jobs, outcomes)):
        what = f"concurrent request {i} ({'stream' if stream else 'non-stream'}, prompt {key})"
        _require_ids(outcome, what)
        if stream and not outcome.prompt_ids_on_first_chunk:
            raise CheckFailed(f"{what}: prompt_token_ids not on the first chunk")
        notes += _decode_matches(target, outcome, what)
        _parity(target, outcome, solo[key], what + " vs the same request alone")
    return _with_notes("n=2 (stream and not) and 16 concurrent mixed requests all pass", notes)


TOKEN_IDS = {"vllm": None, "sglang": "token-ids"}
# The contract every patched engine keeps (token ids; the tito patch's input ids). Each patched feature's
# checks are in their own module beside this one (suite.all_checks puts them in order).
CORE: list[Check] = [
    Check("nonstream-decode", "non-streaming: decode(token_ids) == reasoning + content + tool calls as parsed",
          TOKEN_IDS, check_nonstream_decode),
    Check("stream-decode", "streaming: ids decode to the reasoning, content and tool-call deltas; prompt ids on "
          "the first chunk", TOKEN_IDS,
          check_stream_decode),
    Check("stream-parity", "streaming and non-streaming give the same prompt and completion ids", TOKEN_IDS,
          check_stream_vs_nonstream),
    Check("tools", "tools offered: streamed ids survive the tool-call parser", TOKEN_IDS, check_tools),
    Check("prompt-template", "prompt_token_ids == the local chat-template encoding", TOKEN_IDS,
          check_prompt_template),
    Check("input-ids", "the same turn as input_ids gives the same completion", {"vllm": "tito", "sglang": "tito"},
          check_input_ids_round_trip),
    Check("concurrency", "n=2 and 16 concurrent mixed requests pass the checks above", TOKEN_IDS, check_concurrency),
]

