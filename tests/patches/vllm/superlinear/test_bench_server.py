"""scripts/bench_superlinear_server.py without servers: where the two timing curves cross."""

from __future__ import annotations

import importlib.util

from tests.harness.fixtures import REPO_ROOT


def bench():
    spec = importlib.util.spec_from_file_location("_bench_superlinear_server",
                                                  REPO_ROOT / "scripts" / "bench_superlinear_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(*points):
    return [{"tokens": n, "dense_s": d, "superlinear_s": s} for n, d, s in points]


def test_crossover_interpolates_log_linearly_between_the_bracketing_lengths():
    # superlinear 2x slower at 1K, 2x faster at 4K: equal at 2K on a log-log line.
    assert bench().crossover(rows((1024, 1.0, 2.0), (4096, 2.0, 1.0))) == "~2048 tokens"


def test_crossover_outside_the_measured_range_says_so():
    b = bench()
    assert b.crossover(rows((1024, 1.0, 2.0), (4096, 2.0, 3.0))) == "> 4096 (dense faster at every measured length)"
    assert b.crossover(rows((1024, 2.0, 1.0), (4096, 8.0, 1.0))).startswith("<= 1024")


def test_server_flags_put_each_prompt_in_one_chunk_without_prefix_cache():
    args = bench().server_args(32768)
    assert args[args.index("--max-num-batched-tokens") + 1] == "32768"
    assert "--no-enable-prefix-caching" in args
