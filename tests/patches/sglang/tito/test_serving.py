"""tito on SGLang's real ``OpenAIServingChat``, on every SGLang group, applied and reverted through the API.

For each version, on a private copy of the venv's ``sglang`` (the shared venv is never written),
``serving_driver.py`` runs three times: with tito alone, with token-ids and tito together, and after
both are reverted, the upstream baseline (its files checked byte-identical to the release's; it runs
after the patched code ran from the same copy, so a stale module the revert left would show as tito's
behaviour, which the baseline tests rule out). Those runs share their processes with the token-ids
tests' (tests/patches/sglang/group_runs.py: importing SGLang is most of a run's time). It drives the
real serving class (tiny model's tokenizer and chat template, hermes tool-call and qwen3 reasoning
parsers) with a scripted tokenizer manager that records what the engine is asked and answers with
real token ids and SGLang's logprob triples; see the token-ids driver it reuses. Every case is a
request body; see ``cases_for`` in the driver.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from tests.harness.fixtures import SGLANG_PROVED
from tests.patches.sglang.group_runs import group_runs
from tests.patches.sglang.token_ids.test_serving import body, streamed_ids
from tests.patches.sglang.token_ids.test_serving import chunk_payloads as payloads
from tests.patches.sglang.token_ids.test_serving import (
    normalized as token_ids_normalized,
)

pytestmark = pytest.mark.engine

VERSIONS = SGLANG_PROVED["tito"]  # one release per distinct version of the files the patch edits
SCENARIOS = ("plain", "tool_call", "reasoning_then_tool_call", "n2")
STREAMS = ("nonstream", "stream")


@dataclass
class Runs:
    version: str
    unpatched: dict  # the baseline: both reverted
    tito: dict  # tito alone
    both: dict  # token-ids and tito
    sha_before: dict[str, str]
    sha_tito: dict[str, str]
    sha_reverted: dict[str, str]
    states: dict[str, set[str]]


@pytest.fixture(scope="module", params=VERSIONS)
def runs(request, tmp_path_factory) -> Runs:
    group = group_runs(request.param, tmp_path_factory)
    states = group.states_reverted
    return Runs(request.param, group.unpatched_tito, group.tito, group.both, group.sha_before, group.tito_sha,
                group.sha_reverted,
                {"both": group.both_states["tito"] | group.both_states["token-ids"],
                 **{f"reverted-{k}": v for k, v in states.items()}})


def skip_where_upstream_streams_other_logprobs(runs: Runs, scenario: str, mode: str) -> None:
    """Where the release's own stream (no patch, messages, logprobs) does not give the non-streamed
    logprob entries (SGLang 0.5.10-0.5.22 slice an incremental stream's logprobs by the count of ids
    sent before, which such a stream does not have), the patch's ids cannot be held to them either."""
    upstream = runs.unpatched["cases"]
    streamed = logprob_entries(upstream[f"{scenario}/messages_logprobs/stream/{mode}"], True)
    plain = logprob_entries(upstream[f"{scenario}/messages_logprobs/nonstream/{mode}"], False)
    for index, got in streamed.items():
        # tops left out: 0.5.9's streamed tops are wrong and the patch rebuilds them (tested); a choice
        # streamed without logprobs at all is the tool-call parser case, tested as it is
        got, want = without_tops(got), without_tops(plain.get(index, []))
        if got and (got != want[: len(got)] or len(got) < len(want) - 1):
            pytest.skip(f"sglang {runs.version}'s own {mode} stream gives other logprob entries than "
                        f"its non-streamed answer (choice {index}: {len(got)} entries vs {len(want)})")


def logprobs_by_callers(runs: Runs) -> bool:
    """Whether the release builds logprob entries in its two callers (before 0.5.21: no
    ``_build_token_logprobs_from_raw``), where the patch decorates those (as the codemods choose)."""
    return not runs.unpatched["features"]["raw_logprobs"]


# --------------------------------------------------------------------------------------------------
# reading the driver's output

def normalized(case: dict) -> dict:
    """The response with its clock and random tool-call ids fixed (the engine view left out)."""
    return token_ids_normalized({k: v for k, v in case.items() if k != "engine"})


def logprob_entries(case: dict, stream: bool) -> dict[int, list[dict]]:
    """Each choice's logprobs.content entries (concatenated over the chunks when streaming)."""
    out: dict[int, list[dict]] = {}
    choices = [c for p in payloads(case) for c in p["choices"]] if stream else body(case)["choices"]
    for choice in choices:
        out.setdefault(choice["index"], []).extend((choice.get("logprobs") or {}).get("content") or [])
    return out


def without_token_id(value):
    if isinstance(value, dict):
        return {k: without_token_id(v) for k, v in value.items() if k != "token_id"}
    if isinstance(value, list):
        return [without_token_id(v) for v in value]
    return value


def without_tops(value):
    if isinstance(value, dict):
        return {k: without_tops(v) for k, v in value.items() if k != "top_logprobs"}
    if isinstance(value, list):
        return [without_tops(v) for v in value]
    return value


def response_json(case: dict):
    case = normalized(case)
    if "body" in case:
        return json.loads(case["body"])
    return [json.loads(c[len("data: "):]) if c.startswith("data: {") else c for c in case["chunks"]]


def engine(case: dict) -> dict:
    (request,) = case["engine"]  # exactly one engine request per chat request
    return request


def same_engine_request(a: dict, b: dict) -> bool:
    """Equal engine requests; no stop strings may be ``None`` or ``[]`` (0.5.23's own input_ids
    branch says ``[]`` where its template path says ``None``)."""
    return {**a, "stop": a["stop"] or []} == {**b, "stop": b["stop"] or []}


# --------------------------------------------------------------------------------------------------
# the patch on and off


def test_apply_and_revert_alone_or_together_restore_the_files_byte_for_byte(runs):
    assert runs.states["both"] == {"applied"}
    assert all(runs.sha_tito[f] != runs.sha_before[f] for f in runs.sha_before)
    assert runs.sha_reverted == runs.sha_before
    assert runs.states["reverted-tito"] == runs.states["reverted-token-ids"] == {"not applied"}


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_requests_without_tito_fields_are_byte_identical_to_the_unpatched_engine(runs, scenario):
    for stream in STREAMS:
        k = f"{scenario}/messages/{stream}"
        assert normalized(runs.tito["cases"][k]) == normalized(runs.unpatched["cases"][k]), k
        assert engine(runs.tito["cases"][k]) == engine(runs.unpatched["cases"][k]), k
        for mode in ("cumulative", "incremental"):  # with logprobs: the same, plus token_id
            k = f"{scenario}/messages_logprobs/{stream}/{mode}"
            got, want = response_json(runs.tito["cases"][k]), response_json(runs.unpatched["cases"][k])
            if logprobs_by_callers(runs) and stream == "stream":  # tito rebuilds the stream tops there
                got, want = without_tops(got), without_tops(want)
            assert without_token_id(got) == want, k


def test_upstream_ignores_or_refuses_what_the_patch_serves(runs):
    """Why the patch: 0.5.9 drops ``input_ids`` (the template's prompt goes to the engine) and has
    no ``logprob_start_len``; 0.5.23 honours ``input_ids`` but wants ``messages`` too."""
    custom = runs.unpatched["cases"]["plain/custom_ids/nonstream"]
    start = runs.unpatched["cases"]["start/messages/2"]
    if not runs.unpatched["features"]["native_input_ids"]:  # before 0.5.13
        assert engine(custom)["input_ids"] == runs.unpatched["template_ids"]["plain"]
    else:
        assert engine(custom)["input_ids"] == runs.unpatched["custom_ids"]
        only = runs.unpatched["cases"]["plain/input_ids_only/nonstream"]
        assert only["status"] == 400 and "Messages cannot be empty" in only["body"]
    assert engine(start)["logprob_start_len"] == -1  # upstream hard-codes it on chat


# --------------------------------------------------------------------------------------------------
# input_ids: the prompt, exactly


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("stream", STREAMS)
def test_input_ids_are_the_engine_prompt_and_messages_never_change_it(runs, scenario, stream):
    for run in (runs.tito, runs.both):
        for kind in ("custom_ids", "no_messages", "sampling", "logprobs"):
            k = f"{scenario}/{kind}/{stream}" + ("/cumulative" if kind == "logprobs" else "")
            request = engine(run["cases"][k])
            assert request["input_ids"] == run["custom_ids"] and request["text"] is None, k


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("stream", STREAMS)
def test_template_ids_sent_as_input_ids_answer_exactly_as_the_messages_do(runs, scenario, stream):
    """Tool calls, reasoning, n=2, streaming: with ``input_ids`` (and ``messages`` for the parsers, or
    none) the response is the templated request's, byte for byte, and so is the engine request."""
    cases = runs.both["cases"]
    templated = cases[f"{scenario}/messages_ids/{stream}"]
    for kind in ("input_ids", "input_ids_only"):
        sent = cases[f"{scenario}/{kind}/{stream}"]
        assert normalized(sent) == normalized(templated), kind
        assert same_engine_request(engine(sent), engine(templated)), kind


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_prompt_token_ids_echo_input_ids_with_token_ids_applied(runs, scenario):
    cases = runs.both["cases"]
    completions = runs.both["completions"][scenario]
    plain = body(cases[f"{scenario}/custom_ids/nonstream"])
    assert plain["prompt_token_ids"] == runs.both["custom_ids"]
    assert [c["token_ids"] for c in plain["choices"]] == completions
    prompt, per_choice = streamed_ids(cases[f"{scenario}/custom_ids/stream"])
    assert prompt == runs.both["custom_ids"]
    assert per_choice == dict(enumerate(completions))


def test_tito_alone_takes_input_ids_and_leaves_the_echo_to_token_ids(runs):
    plain = body(runs.tito["cases"]["plain/custom_ids/nonstream"])
    assert "prompt_token_ids" not in plain and "token_ids" not in plain["choices"][0]
    assert plain["choices"][0]["message"]["content"] == body(runs.both["cases"]["plain/custom_ids/nonstream"])[
        "choices"][0]["message"]["content"]


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("stream", STREAMS)
def test_sampling_options_reach_the_engine_with_input_ids(runs, scenario, stream):
    request = engine(runs.both["cases"][f"{scenario}/sampling/{stream}"])
    assert request["stop"] == ["general", "fine"]  # stop strings are not dropped with input_ids
    assert request["stop_token_ids"] == [13]
    assert request["max_new_tokens"] == 7
    assert request["n"] == (2 if scenario == "n2" else 1)


@pytest.mark.parametrize("scenario", ["tool_call", "reasoning_then_tool_call"])
@pytest.mark.parametrize("stream", STREAMS)
def test_tool_calls_and_reasoning_are_parsed_with_input_ids_only(runs, scenario, stream):
    case = runs.both["cases"][f"{scenario}/input_ids_only/{stream}"]
    if stream == "nonstream":
        choice = body(case)["choices"][0]
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
        if scenario == "reasoning_then_tool_call":
            assert choice["message"]["reasoning_content"] == "The user wants weather."
    else:
        deltas = [c["delta"] for p in payloads(case) for c in p["choices"]]
        assert any((d.get("tool_calls") or [{}])[0].get("function", {}).get("name") == "get_weather" for d in deltas)
        if scenario == "reasoning_then_tool_call":
            assert "".join(d.get("reasoning_content") or "" for d in deltas) == "The user wants weather."


# --------------------------------------------------------------------------------------------------
# logprobs carry ids


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("stream", STREAMS)
@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
@pytest.mark.parametrize("kind", ["logprobs", "messages_logprobs"])
def test_every_logprob_entry_and_top_entry_carries_its_token_id(runs, scenario, stream, mode, kind):
    if stream == "stream":
        skip_where_upstream_streams_other_logprobs(runs, scenario, mode)
    for run in (runs.tito, runs.both):
        entries = logprob_entries(run["cases"][f"{scenario}/{kind}/{stream}/{mode}"], stream == "stream")
        completions = dict(enumerate(run["completions"][scenario]))
        upstream = logprob_entries(runs.unpatched["cases"][f"{scenario}/messages_logprobs/{stream}/{mode}"],
                                   stream == "stream")
        if stream == "stream" and scenario in ("tool_call", "reasoning_then_tool_call") and not any(upstream.values()):
            assert not any(entries.values())  # 0.5.9 streams no logprobs once a tool-call parser runs
            continue
        assert entries.keys() == completions.keys()
        for index, got in entries.items():
            ids = [e["token_id"] for e in got]
            if stream == "stream" and len(ids) == len(completions[index]) - 1:
                # upstream streams no logprob entry for a last token without text (here the EOS
                # of a choice whose final output holds only it); the non-streaming entries have it
                assert completions[index][-1] == run["eos"]
                ids.append(run["eos"])
            assert ids == completions[index]
            for entry in got:
                # the scripted engine's tops: the sampled id, then the next id of the vocabulary
                assert [t["token_id"] for t in entry["top_logprobs"]] == \
                    [entry["token_id"], (entry["token_id"] + 1) % run["vocab"]]
                assert all(type(t["token_id"]) is int for t in entry["top_logprobs"])


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("mode", ["cumulative", "incremental"])
def test_streamed_logprob_entries_are_the_nonstreamed_ones(runs, scenario, mode):
    """Also where 0.5.9 gave every entry of a multi-token chunk the first token's top logprobs."""
    skip_where_upstream_streams_other_logprobs(runs, scenario, mode)
    for run in (runs.tito, runs.both):
        plain = logprob_entries(run["cases"][f"{scenario}/logprobs/nonstream/{mode}"], False)
        streamed = logprob_entries(run["cases"][f"{scenario}/logprobs/stream/{mode}"], True)
        upstream = logprob_entries(runs.unpatched["cases"][f"{scenario}/messages_logprobs/stream/{mode}"], True)
        if scenario in ("tool_call", "reasoning_then_tool_call") and not any(upstream.values()):
            # 0.5.9 (and 0.5.13) stream no logprobs at all once a tool-call parser runs (upstream behaviour)
            assert all(not got for got in streamed.values())
            continue
        for index, got in streamed.items():
            assert got == plain[index][: len(got)] and len(got) >= len(plain[index]) - 1


# --------------------------------------------------------------------------------------------------
# logprob_start_len


def test_logprob_start_len_reaches_the_engine_and_comes_back_as_prompt_logprobs(runs):
    for run in (runs.tito, runs.both):
        case = run["cases"]["start/input_ids/3"]
        request = engine(case)
        # SGLang's first prompt logprob is always empty: the engine starts one position earlier
        assert request["logprob_start_len"] == 2 and request["return_logprob"] is True
        response = body(case)
        ids = run["custom_ids"]
        prompt_logprobs = response["prompt_logprobs"]
        assert len(prompt_logprobs) == len(ids)
        assert prompt_logprobs[:3] == [None, None, None]
        for position in range(3, len(ids)):
            entry = prompt_logprobs[position]
            assert list(entry) == [str(ids[position])]
            assert entry[str(ids[position])]["logprob"] < 0
        assert response["choices"][0]["logprobs"] is None  # logprobs were not asked for


def test_logprob_start_len_zero_with_top_logprobs(runs):
    response = body(runs.both["cases"]["start/input_ids/0_top"])
    ids = runs.both["custom_ids"]
    prompt_logprobs = response["prompt_logprobs"]
    assert prompt_logprobs[0] is None  # no logprob for the first prompt token
    for position in range(1, len(ids)):
        assert list(prompt_logprobs[position]) == [str(ids[position]), str(ids[position] + 1)]
    assert response["choices"][0]["logprobs"]["content"]  # the output logprobs as asked


def test_logprob_start_len_minus_one_and_absent_compute_none(runs):
    case = runs.both["cases"]["start/input_ids/-1"]
    assert engine(case)["logprob_start_len"] == -1 and engine(case)["return_logprob"] is False
    assert "prompt_logprobs" not in body(case)
    assert "prompt_logprobs" not in body(runs.both["cases"]["plain/custom_ids/nonstream"])


def test_logprob_start_len_on_a_templated_prompt_and_with_n2(runs):
    templated = body(runs.both["cases"]["start/messages/2"])
    assert len(templated["prompt_logprobs"]) == len(runs.both["template_ids"]["plain"])
    assert templated["prompt_logprobs"][:2] == [None, None] and templated["prompt_logprobs"][2]
    n2 = runs.both["cases"]["start/n2/1"]
    assert engine(n2)["logprob_start_len"] == 0
    assert len(body(n2)["prompt_logprobs"]) == len(runs.both["custom_ids"]) and len(body(n2)["choices"]) == 2


# --------------------------------------------------------------------------------------------------
# bad input

BAD = {
    "str": "`input_ids` must be a list of integer token ids, got str",
    "item_str": "`input_ids` must contain only integers: item 1 is str '2'",
    "item_float": "`input_ids` must contain only integers: item 0 is float 2.0",
    "item_bool": "`input_ids` must contain only integers: item 0 is bool True",
    "negative": "`input_ids` must not contain negative ids: item 1 is -1",
    "vocab": "`input_ids` item 1 is 4096, out of the vocabulary (ids must be < 4096)",
    "empty": "`input_ids` must not be empty: the prompt needs at least one token",
    "too_long_for_max_tokens": "`input_ids` has 4086 tokens and max_tokens is 10: 4096 reaches the model's "
    "context of 4096 tokens",
    "too_long": "`input_ids` has 4096 tokens, which leaves no room for output in the model's context of 4096 tokens",
    "start_past_prompt": "`logprob_start_len` is 7, but the prompt has only 7 tokens (use -1, or a position "
    "from 0 to 6)",
    "start_past_templated_prompt": "`logprob_start_len` is 100000, but the prompt has only 24 tokens",
    "start_negative": "`logprob_start_len` must be -1 (no prompt logprobs) or a prompt position >= 0, got -2",
    "start_str": "`logprob_start_len` must be an integer, got str '3'",
    "start_stream": "`logprob_start_len` is not available with `stream=true`",
}


@pytest.mark.parametrize("name", BAD)
@pytest.mark.parametrize("stream", STREAMS)
def test_bad_input_is_a_400_naming_the_field(runs, name, stream):
    for run in (runs.tito, runs.both):
        key = f"bad/{name}/{stream}"
        if key not in run["cases"]:
            assert name == "start_stream" and stream == "nonstream"
            continue
        case = run["cases"][key]
        assert case["status"] == 400, (key, case)
        message = case.get("validation") or json.loads(case["body"])["message"]
        expected = BAD[name]
        if name.startswith("start_past_prompt") and stream == "stream":
            expected = BAD["start_stream"]
        if name == "start_past_templated_prompt" and stream == "stream":
            expected = BAD["start_stream"]
        assert expected in message, (key, message)
        assert not case.get("engine"), "a refused request must not reach the engine"
