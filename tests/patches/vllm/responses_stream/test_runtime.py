"""runtime.py inside a real vLLM venv (no server): vLLM's own hermes / qwen3 / pythonic parsers, a real
ResponsesRequest, scripted token deltas; streamed events pass the grammar checker, the non-streaming
items equal the streamed ones, a generation error ends in response.failed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from scripts.support.responses_requests import MODEL
from scripts.support.vllm_private import venv_python
from tests.harness.channel import run_driver
from tests.harness.fixtures import REPO_ROOT
from toolkit.verify.grammar import check_events, compare_outputs
from tests.patches.vllm.responses_stream.support import CASES, EXPECTED, summary

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def probe() -> dict:
    python = venv_python()
    if not python.exists():
        pytest.skip(f"no vLLM venv at {python.parent.parent} (scripts/envs.py builds it)")
    model = MODEL.make()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}
    return run_driver([str(python), str(Path(__file__).with_name("engine_probe.py")), str(model)],
                      env=env, timeout=600).ok()["cases"]


def whole_stream(case: dict) -> list[dict]:
    terminal = dict(case["terminal"])
    response = terminal["response"]
    start = {"id": response["id"], "status": "in_progress", "output": []}
    events = [{"type": "response.created", "response": start}, {"type": "response.in_progress", "response": start},
              *case["events"], terminal]
    for number, event in enumerate(events):
        event["sequence_number"] = number
    return events


@pytest.mark.parametrize("case", [c for c, _, _ in CASES])
def test_runtime_streams_grammatical_items_with_real_parsers(probe: dict, case: str) -> None:
    run = probe[case]
    assert check_events(whole_stream(run)) == []
    assert summary(run["items"]) == EXPECTED[case]
    assert compare_outputs(run["items"], run["nonstream"], ignore_ids=True) == []


def test_a_generation_error_ends_in_response_failed(probe: dict) -> None:
    run = probe["generation_error"]
    assert run["terminal"]["type"] == "response.failed"
    assert run["terminal"]["response"]["error"]["message"] == "Internal server error"
    assert check_events(whole_stream(run)) == []
    assert [i["type"] for i in run["terminal"]["response"]["output"]] == ["reasoning", "message"]


def test_a_parser_without_markers_goes_through_the_item_machine(probe: dict) -> None:
    run = probe["markerless_parser"]
    assert check_events(whole_stream(run)) == []
    assert summary(run["items"]) == [("call", "get_weather", '{"city": "Oslo"}', "completed")]
    assert compare_outputs(run["items"], run["nonstream"], ignore_ids=True) == []
