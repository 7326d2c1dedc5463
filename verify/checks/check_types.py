"""What every `toolkit verify` check builds on: the server under test (:class:`Target`), a check and its
result, the failure a check raises, and the requests and comparisons the checks share.

Every check runs greedy requests against a live OpenAI-compatible server and compares what comes
back with itself (stream vs non-stream, concurrent vs alone) and with the model's own tokenizer
run locally. Each check names the patch it needs per engine (None: the engine has it natively)
and is skipped, with the reason, when that patch is not applied.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from toolkit.verify.client import ChatClient

PASS, FAIL, SKIP, ERROR = "pass", "fail", "skip", "error"

MESSAGES: list[dict[str, str]] = [
    {"role": "system", "content": "You are a terse assistant."},
    {"role": "user", "content": "Name three prime numbers and say why they are prime."},
]
OTHER_MESSAGES: list[dict[str, str]] = [
    {"role": "user", "content": "def fibonacci(n):"},
]
TOOLS: list[dict[str, Any]] = [
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
    # The server's reasoning and tool-call parsers (accounting.py's rules say what each strips); () when it
    # runs none (decode(ids) must equal the content exactly), None when unknown (a server given by --url).
    parsers: tuple[str, ...] | None = ()
    client: ChatClient = field(init=False)

    def __post_init__(self) -> None:
        self.client = ChatClient(self.base_url, self.model)


@dataclass(frozen=True)
class Check:
    name: str
    description: str
    requires: dict[str, str | None]  # engine -> patch id it needs (None: native)
    run: Callable[[Target], str]
    # The environment a server launched for this check needs (a switch its patch reads); the caller's own
    # setting of a name wins.
    env: tuple[tuple[str, str], ...] = ()

    def missing_patch(self, target: Target) -> str | None:
        """The patch this check needs and the target lacks; '' when the engine can't do it at all."""
        if target.engine not in self.requires:
            return ""
        patch = self.requires[target.engine]
        if patch is not None and patch not in target.applied_patches:
            return patch
        return None


class CheckSkipped(Exception):
    """The server under test cannot run this check as configured; the message says why."""

def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def ids_evidence(label_a: str, a: list[int], label_b: str, b: list[int]) -> dict[str, Any]:
    return {label_a: a, label_b: b, "first_difference": first_difference(a, b)}


def decoded(target: Target, ids: list[int]) -> str:
    return target.tokenizer.decode(ids, skip_special_tokens=True)


