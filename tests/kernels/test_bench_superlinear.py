"""The benchmark script's GPU code path, run on CPU through the Triton interpreter (tiny sizes)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench_superlinear.py"


def load_script():
    spec = importlib.util.spec_from_file_location("bench_superlinear", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.triton
def test_gpu_benchmark_dry_run_runs_the_triton_path_end_to_end(triton_device, tmp_path, capsys):
    if triton_device != "cpu":
        pytest.skip("the dry run is the CPU stand-in for a GPU")
    bench = load_script()
    out = tmp_path / "dry.json"
    rc = bench.main(["--gpu", "--dry-run", "--lengths", "64", "--decode-lengths", "96", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "ran interpreted" in printed
    import json

    rows = json.loads(out.read_text())["rows"]
    assert [r["op"] for r in rows] == ["prefill", "prefill-paged", "decode", "decode-paged"]
    assert all(r["max_abs_diff_vs_gather"] < 1e-4 for r in rows)


def test_floors_count_fewer_operations_than_dense_at_long_lengths():
    bench = load_script()
    # The GPU goals are 10x (prefill) and 20x (decode) at 1M: the floors must allow them.
    prefill = bench.floors("prefill", 1 << 15, 2)
    decode = bench.floors("decode", 1 << 20, 2)
    assert prefill["sl_flops"] * 10 < prefill["dense_flops"]
    assert decode["sl_bytes"] * 20 < decode["dense_bytes"]
    assert decode["sl_flops"] * 20 < decode["dense_flops"]
