"""token-ids on SGLang's real ``OpenAIServingChat``, applied and reverted through the toolkit API.

For each SGLang group (``SGLANG_PROVED``), the toolkit patches a private copy of its ``sglang``
(``private_sglang.py``: the shared venv is never written). ``serving_driver.py`` runs under it twice
(importing SGLang is most of a run's time, so the tito tests' runs share these processes:
tests/patches/sglang/group_runs.py): patched, with every case and then the vanilla ones again
under ``TOOLKIT_RETURN_TOKEN_IDS=1`` (the runtime reads the switch per request), and reverted, which is
the upstream baseline: its files are checked byte-identical to the release's, and it runs after the
patched code ran from the same copy, so a stale module the revert left would show as a field of ours
(checked). It drives the real serving class with the tiny model's tokenizer and chat template,
SGLang's hermes tool-call and qwen3 reasoning parsers, and a tokenizer manager that yields SGLang's
own output dicts, cumulative and incremental, n=1 and n=2.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.harness.fixtures import SGLANG_PROVED, ensure_tiny_model
from tests.patches.sglang.group_runs import group_runs

pytestmark = pytest.mark.engine

VERSIONS = SGLANG_PROVED["token-ids"]  # one release per distinct version of the files the patch edits
SCENARIOS = ("plain", "tool_call", "reasoning_then_tool_call", "n2")
MODES = ("cumulative", "incremental")


@dataclass
class Runs:
    version: str
    unpatched: dict  # the baseline: the patch reverted
    patched: dict
    patched_env: dict
    sha_before: dict[str, str]
    sha_patched: dict[str, str]
    sha_reverted: dict[str, str]
    status_patched: set[str]
    status_reverted: set[str]


@pytest.fixture(scope="module", params=VERSIONS)
def runs(request, tmp_path_factory) -> Runs:
    group = group_runs(request.param, tmp_path_factory)
    return Runs(request.param, group.unpatched_token_ids, group.token_ids, group.token_ids_env, group.sha_before,
                group.token_ids_sha, group.token_ids_sha_reverted, group.token_ids_status,
                group.token_ids_status_reverted)


# --------------------------------------------------------------------------------------------------
# reading the driver's output

_VOLATILE = [(re.compile(r'"created":\d+'), '"created":0'), (re.compile(r'"call_[0-9a-f]{24}"'), '"call_x"')]


def normalized(case: dict) -> dict:
    """The response with its clock and random tool-call ids fixed; every other byte as it was."""
    def fix(text: str) -> str:
        for pattern, replacement in _VOLATILE:
            text = pattern.sub(replacement, text)
        return text

    out = dict(case)
    if "body" in out:
        out["body"] = fix(out["body"])
    if "chunks" in out:
        out["chunks"] = [fix(chunk) for chunk in out["chunks"]]
    return out


def body(case: dict) -> dict:
    assert case["status"] == 200, case
    return json.loads(case["body"])


def chunk_payloads(case: dict) -> list[dict]:
    assert case["status"] == 200, case
    return [json.loads(c[len("data: "):]) for c in case["chunks"] if c.startswith("data: {")]


def streamed_ids(case: dict) -> tuple[list[int] | None, dict[int, list[int]]]:
    """prompt_token_ids of the first chunk, and each choice's token_ids concatenated."""
    payloads = chunk_payloads(case)
    per_choice: dict[int, list[int]] = {}
    for payload in payloads:
        for choice in payload["choices"]:
            per_choice.setdefault(choice["index"], []).extend(choice.get("token_ids", []))
    return payloads[0].get("prompt_token_ids"), per_choice


def key(scenario: str, kind: str, stream: bool, mode: str) -> str:
    return f"{scenario}/{kind}/{'stream' if stream else 'nonstream'}/{mode}"


@pytest.fixture(scope="module")
def tokenizer():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(ensure_tiny_model()) / "tokenizer.json"))


# --------------------------------------------------------------------------------------------------
# the patch on and off


def test_apply_and_revert_through_the_api_restore_the_files_byte_for_byte(runs):
    assert runs.status_patched == {"applied"}
    assert all(runs.sha_patched[f] != runs.sha_before[f] for f in runs.sha_before)
    assert runs.sha_reverted == runs.sha_before
    assert runs.status_reverted == {"not applied"}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_vanilla_requests_are_byte_identical_to_the_unpatched_engine(runs, scenario):
    for mode in MODES:
        for stream in (False, True):
            k = key(scenario, "vanilla", stream, mode)
            assert normalized(runs.patched["cases"][k]) == normalized(runs.unpatched["cases"][k]), k


def test_reverted_engine_serves_no_field_of_the_patch(runs):
    """The baseline runs on the reverted files after the patched code ran from the same copy: what a
    stale module or bytecode would add shows here (no release has a response-level prompt_token_ids)."""
    assert runs.unpatched["cases"].keys() == runs.patched["cases"].keys()
    for k, case in runs.unpatched["cases"].items():
        if case["status"] != 200:
            continue
        payloads = chunk_payloads(case) if "chunks" in case else [body(case)]
        assert all("prompt_token_ids" not in payload for payload in payloads), k
        if not runs.unpatched["features"]["own_token_ids"]:
            assert all("token_ids" not in choice for p in payloads for choice in p["choices"]), k


def test_upstream_0_5_23_refused_streams_with_return_token_ids_and_the_patch_serves_them(runs):
    for scenario in SCENARIOS:
        for mode in MODES:
            k = key(scenario, "ids", True, mode)
            # a release without its own return_token_ids on chat (before 0.5.17) ignores the unknown field
            expected = 400 if runs.unpatched["features"]["own_token_ids"] else 200
            assert runs.unpatched["cases"][k]["status"] == expected, k
            assert runs.patched["cases"][k]["status"] == 200, k


# --------------------------------------------------------------------------------------------------
# the contract


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("mode", MODES)
def test_nonstream_ids_are_the_engine_ids_and_the_chat_template_prompt(runs, scenario, mode, tokenizer):
    response = body(runs.patched["cases"][key(scenario, "ids", False, mode)])
    completions = runs.patched["completions"][scenario]
    assert response["prompt_token_ids"] == runs.patched["prompt_ids"][scenario]
    assert [c["token_ids"] for c in response["choices"]] == completions
    for choice in response["choices"]:
        text = tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
        if scenario in ("plain", "n2"):
            assert text == choice["message"]["content"]
        else:  # the parsers split the text into reasoning, content and tool calls
            assert "<tool_call>" in text and choice["message"]["tool_calls"]


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("mode", MODES)
def test_stream_ids_concatenated_equal_nonstream_ids(runs, scenario, mode):
    plain = body(runs.patched["cases"][key(scenario, "ids", False, mode)])
    prompt, per_choice = streamed_ids(runs.patched["cases"][key(scenario, "ids", True, mode)])
    assert prompt == plain["prompt_token_ids"]
    assert per_choice == {c["index"]: c["token_ids"] for c in plain["choices"]}


def skip_where_upstream_streams_wrong_text(runs, mode: str) -> None:
    """SGLang 0.5.10's incremental streams send only the new text but its chat serving still slices
    it as if it were cumulative, so upstream itself streams wrong text there: ids cannot line up with
    text the engine never sends (the ids themselves are still checked by the other tests)."""
    vanilla = runs.unpatched["cases"]
    streamed = "".join(p["choices"][0]["delta"].get("content") or ""
                       for p in chunk_payloads(vanilla[key("plain", "vanilla", True, mode)]) if p["choices"])
    whole = body(vanilla[key("plain", "vanilla", False, mode)])["choices"][0]["message"]["content"]
    if streamed != whole:
        pytest.skip(f"sglang {runs.version}'s own {mode} stream sends {streamed!r}, not {whole!r}")


@pytest.mark.parametrize("mode", MODES)
def test_each_stream_chunk_carries_the_ids_behind_its_text(runs, mode, tokenizer):
    skip_where_upstream_streams_wrong_text(runs, mode)
    payloads = chunk_payloads(runs.patched["cases"][key("plain", "ids", True, mode)])
    assert "prompt_token_ids" in payloads[0] and "token_ids" not in payloads[0]["choices"][0]  # role chunk
    assert all("prompt_token_ids" not in p for p in payloads[1:])
    ids: list[int] = []
    text = ""
    for payload in payloads[1:]:
        choice = payload["choices"][0]
        ids += choice["token_ids"]
        text += choice["delta"].get("content") or ""
        assert tokenizer.decode(ids, skip_special_tokens=True) == text


@pytest.mark.parametrize("scenario", ["tool_call", "reasoning_then_tool_call"])
@pytest.mark.parametrize("mode", MODES)
def test_ids_held_back_by_the_parsers_go_out_with_the_next_chunk(runs, scenario, mode, tokenizer):
    skip_where_upstream_streams_wrong_text(runs, mode)
    payloads = chunk_payloads(runs.patched["cases"][key(scenario, "ids", True, mode)])
    carrying = [p["choices"][0] for p in payloads if "token_ids" in p["choices"][0]]
    named = next(c for c in carrying if (c["delta"].get("tool_calls") or [{}])[0].get("function", {}).get("name"))
    # the chunk naming the tool carries the ids the parser held while "<tool_call>\n{..." arrived
    assert tokenizer.token_to_id("<tool_call>") in named["token_ids"]
    # "</tool_call>" and EOS yield no text: they go out on the finish chunk
    finish = carrying[-1]
    assert finish["finish_reason"] == "tool_calls"
    assert finish["token_ids"][-2:] == [tokenizer.token_to_id("</tool_call>"), runs.patched["eos"]]
    if scenario == "reasoning_then_tool_call":
        reasoning = [c for c in carrying if c["delta"].get("reasoning_content")]
        assert reasoning and all(c["token_ids"] for c in reasoning[:1])


@pytest.mark.parametrize("mode", MODES)
def test_two_choices_keep_their_own_ids(runs, mode):
    prompt, per_choice = streamed_ids(runs.patched["cases"][key("n2", "ids", True, mode)])
    assert per_choice == dict(enumerate(runs.patched["completions"]["n2"]))
    assert per_choice[0] != per_choice[1]


def test_server_wide_env_flag_gives_vanilla_requests_the_same_ids(runs):
    for scenario in SCENARIOS:
        for mode in MODES:
            for stream in (False, True):
                with_env = runs.patched_env["cases"][key(scenario, "vanilla", stream, mode)]
                asked = runs.patched["cases"][key(scenario, "ids", stream, mode)]
                if stream:
                    assert streamed_ids(with_env) == streamed_ids(asked)
                else:
                    got, want = body(with_env), body(asked)
                    assert got["prompt_token_ids"] == want["prompt_token_ids"]
                    assert [c["token_ids"] for c in got["choices"]] == [c["token_ids"] for c in want["choices"]]


def test_0_5_23_own_token_id_fields_keep_working(runs):
    if not runs.unpatched["features"]["own_prompt_token_ids"]:
        pytest.skip(f"{runs.version} has no token-id fields of its own (0.5.13 and later have)")
    cases = {k.split("/", 1)[1]: v for k, v in runs.patched["cases"].items() if k.startswith("own_flags/")}
    before = {k.split("/", 1)[1]: v for k, v in runs.unpatched["cases"].items() if k.startswith("own_flags/")}
    # return_prompt_token_ids alone is upstream's, untouched; with stream it is still a 400
    assert normalized(cases["return_prompt_token_ids"]) == normalized(before["return_prompt_token_ids"])
    assert cases["stream_return_prompt_token_ids"]["status"] == 400
    assert normalized(cases["stream_return_prompt_token_ids"]) == normalized(before["stream_return_prompt_token_ids"])
    if not runs.unpatched["features"]["own_token_ids"]:
        return  # return_token_ids is ours alone there (the contract tests cover it)
    # return_token_ids: upstream's choice fields as before, plus ours
    ours = body(cases["return_token_ids"])
    theirs = body(before["return_token_ids"])
    if "response_token_ids" in theirs["choices"][0]:  # 0.5.20 on
        assert ours["choices"][0]["response_token_ids"] == ours["choices"][0]["token_ids"]
    prompt = ours.pop("prompt_token_ids")
    if "prompt_token_ids" in theirs["choices"][0]:
        assert prompt == ours["choices"][0]["prompt_token_ids"]
    for choice, own in zip(ours["choices"], theirs["choices"]):
        if "token_ids" not in own:  # 0.5.17's choice has a token_ids of its own: the same ids, compared below
            del choice["token_ids"]
    theirs["created"] = ours["created"]
    assert ours == theirs
