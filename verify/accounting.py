"""Accounting for every completion id: decoded, a choice's ids must equal what the server's parsers split
them into (reasoning, content, tool calls), give or take exactly what those parsers strip.

A reasoning parser moves text into the ``reasoning`` (vLLM 0.27+) or ``reasoning_content`` (older vLLM,
SGLang) field and drops its ``<think>`` / ``</think>`` markers; a tool-call parser turns ``<tool_call>...``
text into ``tool_calls`` whose arguments it may re-serialise. So "decode(ids) == content" is wrong on such a
server; this module checks instead that the decoded text is, in order,

    gap reasoning gap content gap (tool call: gap name glue arguments glue)* gap

where each part is found verbatim (trimmed of whitespace when the parser trims) and every gap holds only
what the active parsers strip: their markers (:class:`ParserRule`), whitespace where they trim it, and
around a tool call its wrapping (JSON keys and punctuation, XML tags). A tool call's arguments are found
verbatim, else as a JSON value equal to them (the parser re-serialised them), else key by key (an XML
format's parameters); when none of these places them, the accounting says the call (and the text after
it) was not decided instead of failing. Pure functions: the checks (checks/core.py) feed it server output.
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

WHITESPACE = r"\s"
JSON_GLUE = (r'"(?:name|arguments|parameters|type|function)"', r"[{}\[\],:;\"]")


@dataclass(frozen=True)
class ParserRule:
    """What one engine parser may leave out of the decoded text, read from its source (``source``)."""

    name: str
    markers: tuple[str, ...]  # regexes the parser strips wherever they occur
    call_glue: tuple[str, ...] = ()  # regexes wrapping a tool call (allowed only next to one)
    trims_whitespace: bool = True
    source: str = ""


THINK = (r"<think>", r"</think>")
HARMONY = (r"<\|(?:start|end|message|channel|call|return|constrain)\|>", r"\bassistant", r"analysis", r"final",
           r"commentary")
# Keyed by the names the engines take on the command line (vLLM's and SGLang's spellings both).
RULES: dict[str, ParserRule] = {rule.name: rule for rule in (
    ParserRule("qwen3", THINK, source="vllm parser/qwen3.py (0.32: engine adapter), reasoning/qwen3_reasoning_parser.py "
               "(0.24-0.31): splits at </think>, drops <think>, rstrips the reasoning; sglang parser/reasoning_parser.py "
               "Qwen3Detector"),
    ParserRule("deepseek_r1", THINK, source="vllm reasoning/deepseek_r1_reasoning_parser.py; sglang DeepSeekR1Detector"),
    ParserRule("openai_gptoss", HARMONY, (r"to=functions\.", r"json", r"<\|constrain\|>"),
               source="vllm entrypoints harmony path (gpt-oss): channels analysis/final/commentary; the special "
               "tokens decode to nothing, their role and channel names stay"),
    ParserRule("hermes", (r"<tool_call>", r"</tool_call>"), JSON_GLUE,
               source="vllm tool_parsers/hermes_tool_parser.py: content before <tool_call>, arguments json.dumps'd"),
    ParserRule("qwen25", (r"<tool_call>", r"</tool_call>"), JSON_GLUE,
               source="sglang function_call/qwen25_detector.py: normal text stripped, arguments json.dumps'd"),
    ParserRule("qwen3_coder", (r"<tool_call>", r"</tool_call>"),
               (r"<function=", r"</function>", r"<parameter=", r"</parameter>", r">"),
               source="vllm tool_parsers/qwen3coder (0.32: parser engine), sglang qwen3_coder_detector.py: XML "
               "parameters become a JSON object"),
    ParserRule("llama3_json", (r"<\|python_tag\|>",), JSON_GLUE,
               source="vllm tool_parsers/llama_tool_parser.py: {\"name\", \"parameters\"} objects joined by ';'"),
    ParserRule("mistral", (r"\[TOOL_CALLS\]",), (*JSON_GLUE, r"\[ARGS\]", r"\[CALL_ID\][A-Za-z0-9]*"),
               source="vllm tool_parsers/mistral_tool_parser.py, sglang mistral_detector.py: [TOOL_CALLS] then a "
               "JSON list (or name[ARGS]{...} from tokenizer v11)"),
)}
ALIASES = {"deepseek-r1": "deepseek_r1", "gpt-oss": "openai_gptoss", "openai": "openai_gptoss",
           "llama3": "llama3_json", "qwen3_xml": "qwen3_coder", "qwen3_json": "hermes"}


def rule_for(name: str) -> ParserRule | None:
    return RULES.get(ALIASES.get(name, name))


@dataclass
class Split:
    """What the server returned for one choice, as its parsers split it."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (name, arguments) in order


class Unaccounted(AssertionError):
    """Decoded ids that the split does not account for: the sentence says where."""

    def __init__(self, detail: str, **evidence: Any) -> None:
        super().__init__(detail)
        self.detail = detail
        self.evidence = evidence


def rules_for(parsers: Sequence[str] | None) -> tuple[list[ParserRule], list[str]]:
    """The rules of ``parsers`` (None: the server's parsers are unknown, so every known rule) and notes on
    what that leaves undecided."""
    if parsers is None:
        return list(RULES.values()), ["the server's parsers are unknown: allowed what any known parser strips"]
    rules: list[ParserRule] = []
    notes: list[str] = []
    for name in parsers:
        rule = rule_for(name)
        if rule is None:
            notes.append(f"parser {name!r} has no accounting rule: allowed what any known parser strips")
            rules.extend(RULES.values())
        else:
            rules.append(rule)
    return rules, notes


class _Gaps:
    def __init__(self, rules: Sequence[ParserRule]) -> None:
        self.trim = any(rule.trims_whitespace for rule in rules)
        anywhere = ([WHITESPACE] if self.trim else []) + [m for rule in rules for m in rule.markers]
        glue = [g for rule in rules for g in rule.call_glue]
        self.plain = re.compile(r"(?:%s)*\Z" % "|".join(anywhere or ["(?!)"]))
        self.call = re.compile(r"(?:%s)*\Z" % "|".join(anywhere + glue or ["(?!)"]))

    def ok(self, gap: str, near_call: bool) -> bool:
        return (self.call if near_call else self.plain).match(gap) is not None

    def find(self, text: str, part: str, start: int, near_call: bool) -> int | None:
        """The first place of ``part`` in ``text`` at or after ``start`` with only allowed text before it."""
        at = text.find(part, start)
        while at != -1:
            if self.ok(text[start:at], near_call):
                return at
            at = text.find(part, at + 1)
        return None


def _json_at(text: str, start: int, value: Any, gaps: _Gaps) -> int | None:
    """The end of the first JSON value equal to ``value`` in ``text`` after ``start`` (glue before it)."""
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[{\[]", text[start:]):
        at = start + match.start()
        if not gaps.ok(text[start:at], True):
            return None
        try:
            found, end = decoder.raw_decode(text, at)
        except ValueError:
            continue
        if found == value:
            return end
    return None


def _keys_at(text: str, start: int, value: dict, gaps: _Gaps) -> int | None:
    """The end of ``value``'s keys and values, in order, with glue between (XML-style parameters)."""
    cursor = start
    for key, item in value.items():
        for piece in (str(key), item if isinstance(item, str) else json.dumps(item)):
            at = gaps.find(text, piece, cursor, True)
            if at is None:
                return None
            cursor = at + len(piece)
    return cursor


def _arguments(text: str, cursor: int, arguments: str, gaps: _Gaps) -> tuple[int | None, str]:
    """Where ``arguments`` end in ``text`` after ``cursor`` and how they were found ('' when verbatim)."""
    raw = arguments.strip()
    if not raw:
        return cursor, ""
    at = gaps.find(text, raw, cursor, True)
    if at is not None:
        return at + len(raw), ""
    try:
        value = json.loads(raw)
    except ValueError:
        return None, "are not JSON and not in the text"
    end = _json_at(text, cursor, value, gaps)
    if end is not None:
        return end, "matched by value (the parser re-serialised them)"
    if isinstance(value, dict):
        end = _keys_at(text, cursor, value, gaps)
        if end is not None:
            return end, "matched key by key (the parser rebuilt them from its format)"
    return None, "could not be placed in the decoded text"


def account(decoded: str, split: Split, parsers: Sequence[str] | None) -> list[str]:
    """Check that ``decoded`` is ``split`` plus only what ``parsers`` strip. Returns notes on what was matched
    loosely or not decided; raises :class:`Unaccounted` naming the first part that is not where it should be,
    or the text left over."""
    rules, notes = rules_for(parsers)
    gaps = _Gaps(rules)
    cursor = 0
    evidence = {"decoded": decoded, "reasoning": split.reasoning, "content": split.content,
                "tool_calls": split.tool_calls, "parsers": list(parsers) if parsers is not None else None}
    for label, text in (("reasoning", split.reasoning), ("content", split.content)):
        part = text.strip() if gaps.trim else text
        if not part:
            continue
        at = gaps.find(decoded, part, cursor, False)
        if at is None:
            raise Unaccounted(f"the {label} is not in decode(token_ids) where the parsers leave it "
                              f"(after {cursor} chars, with only {_allowed(rules)} before it)", **evidence)
        cursor = at + len(part)
    for index, (name, arguments) in enumerate(split.tool_calls):
        at = gaps.find(decoded, name, cursor, True) if name else cursor
        if at is None:
            raise Unaccounted(f"tool call {index}'s name {name!r} is not in decode(token_ids) after the text "
                              "before it", **evidence)
        end, how = _arguments(decoded, at + len(name), arguments, gaps)
        if end is None:
            notes.append(f"tool call {index} ({name}): its arguments {how}: it and the text after it were not "
                         "decided")
            return notes
        if how:
            notes.append(f"tool call {index} ({name}): arguments {how}")
        cursor = end
    rest = decoded[cursor:]
    if not gaps.ok(rest, bool(split.tool_calls)):
        raise Unaccounted(f"decode(token_ids) has text that no field carries: {rest[:80]!r} (after {cursor} "
                          f"chars; the parsers strip only {_allowed(rules)})", **evidence)
    return notes


KEPT_SPECIAL = ("special tokens' text kept, as the request asked (vLLM's mistral tool parser turns "
                "skip_special_tokens off when tools are offered and the tokenizer is not mistral-common's)")


def account_either(skipped: str, kept: str, split: Split, parsers: Sequence[str] | None) -> list[str]:
    """:func:`account` of the ids decoded as the engine does by default (``skipped``: special tokens' text left
    out) or, failing that, with it kept (``kept``): a parser may ask the engine to keep it for a request. The
    first failure is the one raised; a pass on ``kept`` says so in the notes."""
    try:
        return account(skipped, split, parsers)
    except Unaccounted:
        if kept != skipped:
            with contextlib.suppress(Unaccounted):
                return [KEPT_SPECIAL, *account(kept, split, parsers)]
        raise


def _allowed(rules: Sequence[ParserRule]) -> str:
    markers = [m.replace("\\", "") for rule in rules for m in rule.markers]
    trims = any(rule.trims_whitespace for rule in rules)
    what = ", ".join(dict.fromkeys(markers)) or "nothing"
    return what + (" and whitespace" if trims else "")


def split_from_message(message: dict[str, Any]) -> Split:
    """The split of a non-streaming message (``reasoning`` or ``reasoning_content``, whichever the release
    sends; vLLM 0.27-0.30 send both, equal)."""
    reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
    calls = [((call.get("function") or {}).get("name") or "", (call.get("function") or {}).get("arguments") or "")
             for call in message.get("tool_calls") or []]
    return Split(reasoning, message.get("content") or "", calls)


class StreamSplit:
    """The split of a streamed choice, built delta by delta: reasoning and content deltas concatenated, tool
    call argument deltas joined per call index."""

    def __init__(self) -> None:
        self.reasoning = ""
        self.content = ""
        self.calls: dict[int, list[str]] = {}

    def add(self, delta: dict[str, Any]) -> None:
        # one of the two names per delta: a release that sends both sends the same text twice
        self.reasoning += delta.get("reasoning") or delta.get("reasoning_content") or ""
        self.content += delta.get("content") or ""
        for position, call in enumerate(delta.get("tool_calls") or []):
            index = call.get("index", position)
            name_args = self.calls.setdefault(index, ["", ""])
            function = call.get("function") or {}
            name_args[0] += function.get("name") or ""
            name_args[1] += function.get("arguments") or ""

    def split(self) -> Split:
        return Split(self.reasoning, self.content, [(n, a) for _, (n, a) in sorted(self.calls.items())])
