"""The checks behind `toolkit verify`: a served engine keeps the token-id contract.

Every check runs greedy requests against a live OpenAI-compatible server and compares what comes
back with itself (stream vs non-stream, concurrent vs alone) and with the model's own tokenizer
run locally. Each check names the patch it needs per engine (None: the engine has it natively)
and is skipped, with the reason, when that patch is not applied.
"""

from __future__ import annotations

import concurrent.futures
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence, cast

from toolkit.verify.client import ChatClient, ChatOutcome, HTTPStatusError, ServerGone

if TYPE_CHECKING:
    from toolkit.declare import Patch

PASS, FAIL, SKIP, ERROR = "pass", "fail", "skip", "error"

MESSAGES = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name three prime numbers and say why they are prime."},
]
OTHER_MESSAGES = [
    {"role": "user", "content": "def fibonacci(n):"},
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]


@dataclass
class CheckResult:
    name: str
    status: str
    detail: str = ""
    evidence: dict[str, Any] = field(default_factory=dict)


class CheckFailed(AssertionError):
    def __init__(self, detail: str, **evidence: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.evidence = evidence


@dataclass
class Target:
    """The server under test."""

    base_url: str
    model: str  # the served model name
    engine: str  # "vllm" or "sglang"
    tokenizer: Any  # a transformers tokenizer of the model, loaded locally
    applied_patches: set[str]
    client: ChatClient = field(init=False)

    def __post_init__(self) -> None:
        self.client = ChatClient(self.base_url, self.model)


@dataclass(frozen=True)
class Check:
    name: str
    description: str
    requires: dict[str, str | None]  # engine -> patch id it needs (None: native)
    run: Callable[[Target], str]

    def missing_patch(self, target: Target) -> str | None:
        """The patch this check needs and the target lacks; '' when the engine can't do it at all."""
        if target.engine not in self.requires:
            return ""
        patch = self.requires[target.engine]
        if patch is not None and patch not in target.applied_patches:
            return patch
        return None


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def ids_evidence(label_a: str, a: list[int], label_b: str, b: list[int]) -> dict[str, Any]:
    return {label_a: a, label_b: b, "first_difference": first_difference(a, b)}


def decoded(target: Target, ids: list[int]) -> str:
    return target.tokenizer.decode(ids, skip_special_tokens=True)


# What decode(token_ids) may differ from the content by: the engine strips the EOS token's text
# (skip_special_tokens) and nothing else. Anything else is a mismatch.
ROUND_TRIP_ALLOWANCE = "EOS and other special tokens decode to nothing (skip_special_tokens)"


def _require_ids(outcome: ChatOutcome, what: str) -> None:
    if outcome.prompt_token_ids is None:
        raise CheckFailed(f"{what}: no prompt_token_ids in the response")
    for index, choice in outcome.choices.items():
        if not choice.ids_seen:
            raise CheckFailed(f"{what}: choice {index} has no token_ids")


def _decode_matches(target: Target, outcome: ChatOutcome, what: str) -> None:
    for index, choice in sorted(outcome.choices.items()):
        text = decoded(target, choice.token_ids)
        if text != choice.text:
            raise CheckFailed(
                f"{what}: choice {index}: decode(token_ids) != content",
                token_ids=choice.token_ids, decoded=text, content=choice.text,
            )


def check_nonstream_decode(target: Target) -> str:
    outcome = target.client.chat(MESSAGES)
    _require_ids(outcome, "non-streaming")
    _decode_matches(target, outcome, "non-streaming")
    ids = outcome.choices[0].token_ids
    return f"{len(ids)} completion ids decode to the content ({ROUND_TRIP_ALLOWANCE})"


def check_stream_decode(target: Target) -> str:
    outcome = target.client.chat(MESSAGES, stream=True)
    _require_ids(outcome, "streaming")
    if not outcome.prompt_ids_on_first_chunk:
        raise CheckFailed("streaming: prompt_token_ids did not arrive on the first chunk")
    _decode_matches(target, outcome, "streaming")
    return f"{outcome.chunks} chunks; concatenated ids decode to the concatenated deltas"


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


class CheckSkipped(Exception):
    """The server under test cannot run this check as configured; the message says why."""


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
    if plain.choices[0].tool_calls:
        return "the model called a tool; stream and non-stream ids equal"
    _decode_matches(target, plain, "tools, non-streaming")
    _decode_matches(target, stream, "tools, streaming")
    return "text answer with tools offered: stream ids equal non-stream ids and decode to the content"


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
    for outcome, what in ((n2, "n=2"), (n2_stream, "n=2 streaming")):
        _require_ids(outcome, what)
        _decode_matches(target, outcome, what)
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
        _decode_matches(target, outcome, what)
        _parity(target, outcome, solo[key], what + " vs the same request alone")
    return "n=2 (stream and not) and 16 concurrent mixed requests all pass"


TOKEN_IDS = {"vllm": None, "sglang": "token-ids"}
# The contract every patched engine keeps (token ids; the tito patch's input ids). A patch adds its own
# checks through its declaration (``Patch.verify_checks``): see :func:`all_checks`.
CORE: list[Check] = [
    Check("nonstream-decode", "non-streaming: decode(token_ids) == content", TOKEN_IDS, check_nonstream_decode),
    Check("stream-decode", "streaming: ids decode to the deltas; prompt ids on the first chunk", TOKEN_IDS,
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


def patch_skip(check: Check, target: Target) -> CheckResult | None:
    """``check``'s skip on ``target`` when the engine cannot run it or a patch it needs is not applied:
    known from the install alone, before any request. None when it can run."""
    missing = check.missing_patch(target)
    if missing == "":
        return CheckResult(check.name, SKIP, f"not available on {target.engine}")
    if missing:
        return CheckResult(check.name, SKIP, f"patch {missing} is not applied to {target.engine}")
    return None


def skips_before_serving(target: Target, names: list[str] | None = None,
                         checks: Sequence[Check] | None = None) -> list[CheckResult] | None:
    """When not one of ``names`` (default: all) of ``checks`` can run on ``target`` (``patch_skip``: only its
    ``engine`` and ``applied_patches`` are read, so an install will do), their skips; else None. A server
    started for such a run would answer nothing."""
    checks = all_checks() if checks is None else list(checks)
    skips = [patch_skip(check, target) for check in checks if not names or check.name in names]
    return cast("list[CheckResult]", skips) if all(skips) else None  # all(): not one is None


def run_checks(target: Target, names: list[str] | None = None,
               on_result: Callable[[CheckResult], None] | None = None,
               checks: Sequence[Check] | None = None) -> list[CheckResult]:
    """Run ``names`` (default: all) of ``checks`` (default: :func:`all_checks`) against ``target``."""
    checks = all_checks() if checks is None else list(checks)
    known = {check.name for check in checks}
    unknown = [n for n in names or [] if n not in known]
    if unknown:
        raise ValueError(f"unknown check(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    results = []
    for check in checks:
        if names and check.name not in names:
            continue
        result = patch_skip(check, target)
        if result is None:
            try:
                result = CheckResult(check.name, PASS, check.run(target))
            except CheckSkipped as exc:
                result = CheckResult(check.name, SKIP, str(exc))
            except CheckFailed as exc:
                result = CheckResult(check.name, FAIL, exc.detail, exc.evidence)
            except ServerGone as exc:
                result = CheckResult(check.name, ERROR, f"the server stopped answering: {exc}")
            except AssertionError as exc:
                result = CheckResult(check.name, FAIL, str(exc))
        results.append(result)
        if on_result:
            on_result(result)
        if result.status == ERROR:
            break  # a dead server fails every later check the same way
    return results


# The checks whose missing patch makes the verdict "nothing verified"; the others are extras that a
# patch adds (input ids in, the Responses API) and are skipped, with the reason, without it.
CORE_CHECKS = ("nonstream-decode", "stream-decode", "stream-parity", "tools", "prompt-template", "concurrency")


def missing_patches(target: Target) -> list[str]:
    """Patches the target lacks that core checks need (for the "apply these first" message)."""
    return sorted({p for c in CORE if c.name in CORE_CHECKS for p in [c.missing_patch(target)] if p})


def all_checks(patches: Sequence[Patch] | None = None) -> list[Check]:
    """The core checks, then each registered patch's own (its ``verify_checks``), in registry order
    (``patches``: the registry as the caller read it)."""
    from toolkit import patch_registry

    checks = list(CORE)
    for patch in patch_registry.registry() if patches is None else patches:
        checks.extend(check for check in patch.load_verify_checks() if check not in checks)
    return checks


def __getattr__(name: str) -> Any:
    if name == "CHECKS":  # every check, core and contributed (loads the patches' check modules)
        return all_checks()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
