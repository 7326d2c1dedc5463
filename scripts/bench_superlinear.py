#!/usr/bin/env python
"""Benchmark superlinear attention against dense causal attention measured in the same run.

CPU (default): the gather implementation vs PyTorch's dense causal ``scaled_dot_product_attention``
(fp32, B=1, 8 query heads, 2 KV heads, D=64, default superlinear parameters) at L = 4K, 16K, 32K:
prefill time and peak memory, plus one decode step.  Times: one process per length runs both
methods alternately (one warm-up each, then ``--repeats`` calls each) and the table shows the
fastest call (the machine may be shared) and the ratio of medians.  Peak memory: a fresh process
per (method, length) makes one call; peak = ``ru_maxrss`` after the call minus the resident size
just before it (inputs already allocated; the output is included).

GPU (``--gpu``): the Triton kernels vs SDPA's flash backend (bf16), prefill at 32K..1M and one
decode step at 128K..1M (also replayed from CUDA graphs), with the FLOP and byte floors of each;
the ``-paged`` rows run the same keys from a shuffled paged cache (block size 16) through the block
table (``superlinear_attention_paged`` / ``superlinear_decode_paged``; dense baseline unchanged).
``--gpu --dry-run`` runs the same code path on CPU under ``TRITON_INTERPRET=1`` at tiny sizes and
checks the kernels against the gather implementation (times mean nothing there).

    python scripts/bench_superlinear.py                    # CPU table
    python scripts/bench_superlinear.py --gpu              # on a CUDA machine
    python scripts/bench_superlinear.py --gpu --dry-run    # anywhere
    python scripts/bench_superlinear.py --markdown --json out.json
    python scripts/bench_superlinear.py --threads 1 --clock cpu   # a shared machine: own CPU time
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

# The interpreter must be chosen before triton (or anything importing it) is imported.
if "--dry-run" in sys.argv and "--gpu" in sys.argv:
    os.environ["TRITON_INTERPRET"] = "1"

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from toolkit.kernels.superlinear import superlinear_attention, superlinear_decode  # noqa: E402
from toolkit.kernels.superlinear.paged import PagedKV, superlinear_attention_paged, superlinear_decode_paged  # noqa: E402
from toolkit.kernels.superlinear.attention_spans import SuperlinearParams, span_geometry  # noqa: E402

HEADS, KV_HEADS, DIM, BATCH = 8, 2, 64, 1
PAGED_BLOCK_SIZE = 16  # vLLM's default block size
PARAMS = dict(sw_index=0, topk=3, backward_factor=2.0, forward_factor=0.0, span_power=0.5)  # defaults

# Peak dense bf16 tensor FLOP/s and HBM bytes/s, for the floors (public spec sheets, SXM parts).
GPU_PEAKS = {"H100": (989e12, 3.35e12), "H200": (989e12, 4.8e12), "A100": (312e12, 2.0e12),
             "B200": (2250e12, 8.0e12)}


# --------------------------------------------------------------------------------------------------
# Machine description


def machine() -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "arch": platform.machine(),
            "threads": torch.get_num_threads()}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                info["isa"] = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "")
                info["amx"] = "amx_tile" in flags
        info["cores"] = os.cpu_count()
    except OSError:
        info["cpu"] = platform.processor()
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    try:
        import triton

        info["triton"] = triton.__version__
    except Exception:
        pass
    return info


def load_average() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "?"


# --------------------------------------------------------------------------------------------------
# Floors (exact counts from the span tables; spans assumed full length)


def superlinear_counts(length: int, params: SuperlinearParams, decode_at: int | None = None) -> dict:
    """Dot products (length D) per query head: search, span (QK + PV), window (QK + PV)."""
    geo = span_geometry(params, length)
    pos = torch.arange(length, dtype=torch.int64) if decode_at is None else torch.tensor([decode_at])
    stripes = geo.stripe_count[pos].double()
    t = pos + 1
    span = (geo.backward_len[t] + geo.forward_len[t] + 1).double()
    span = torch.minimum(span, (pos + 1 - geo.window).clamp(min=0).double())
    found = torch.minimum(stripes, torch.tensor(float(params.topk)))
    window = torch.minimum(t.double(), torch.tensor(float(geo.window)))
    return {"search": float(stripes.sum()), "span": float((found * span).sum()), "window": float(window.sum()),
            "stripes": float(stripes.sum())}


def floors(kind: str, length: int, dtype_bytes: int) -> dict:
    """FLOPs and bytes that each method must at least do / move (per call, B=1)."""
    params = SuperlinearParams(**PARAMS)
    qkvo = (2 * HEADS + 2 * KV_HEADS) * length * DIM * dtype_bytes
    if kind == "prefill":
        dense_flops = 4.0 * HEADS * DIM * length * (length + 1) / 2
        c = superlinear_counts(length, params)
        sl_flops = HEADS * DIM * (2 * c["search"] + 4 * (c["span"] + c["window"]))
        # K/V are read once at best; Q1 is the same tensor as Q2 in this benchmark.
        return {"dense_flops": dense_flops, "dense_bytes": qkvo, "sl_flops": sl_flops, "sl_bytes": qkvo}
    c = superlinear_counts(length, params, decode_at=length - 1)
    dense_flops = 4.0 * HEADS * DIM * length
    dense_bytes = 2 * KV_HEADS * length * DIM * dtype_bytes
    sl_flops = HEADS * DIM * (2 * c["search"] + 4 * (c["span"] + c["window"]))
    # Stripe keys once per KV head; span and window K/V per query head (each picks its own spans).
    sl_bytes = (KV_HEADS * c["stripes"] + 2 * HEADS * (c["span"] + c["window"])) * DIM * dtype_bytes
    return {"dense_flops": dense_flops, "dense_bytes": dense_bytes, "sl_flops": sl_flops, "sl_bytes": sl_bytes}


# --------------------------------------------------------------------------------------------------
# Workers


def make_qkv(length: int, dtype, device, query_len: int | None = None, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    query_len = length if query_len is None else query_len
    q = torch.randn(BATCH, HEADS, query_len, DIM, generator=g).to(device=device, dtype=dtype)
    k = torch.randn(BATCH, KV_HEADS, length, DIM, generator=g).to(device=device, dtype=dtype)
    v = torch.randn(BATCH, KV_HEADS, length, DIM, generator=g).to(device=device, dtype=dtype)
    return q, k, v


def dense_prefill(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def dense_decode(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _cpu_prefill_fn(method: str, q, k, v):
    if method == "dense":
        return lambda: dense_prefill(q, k, v)
    return lambda: superlinear_attention(q, q, k, v, impl="gather", **PARAMS)


def worker_cpu_memory(method: str, length: int) -> dict:
    """Peak memory of one call in a fresh process: the ``ru_maxrss`` high-water mark after the call
    minus the resident size just before it (inputs allocated, output included)."""
    import resource

    q, k, v = make_qkv(length, torch.float32, "cpu")
    fn = _cpu_prefill_fn(method, q, k, v)
    before = rss_bytes()
    fn()
    return {"peak_bytes": max(0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before)}


# What the CPU timings read: wall time (default), or with ``--clock cpu`` this process's CPU time
# (user + system of all its threads): on a box shared with other jobs, a 1-thread run's CPU time is
# its own work, where its wall time also counts the slices other processes took.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


def worker_cpu_time(length: int, repeats: int) -> dict:
    """Both methods in one process, one warm-up each, then alternating timed calls: a change of
    machine load (the box is shared) hits both."""
    q, k, v = make_qkv(length, torch.float32, "cpu")
    fns = {m: _cpu_prefill_fn(m, q, k, v) for m in ("dense", "superlinear")}
    times = {m: [] for m in fns}
    for fn in fns.values():
        fn()
    for _ in range(repeats):
        for m, fn in fns.items():
            t0 = clock()
            fn()
            times[m].append(clock() - t0)
    return times


def time_cpu(fn, repeats: int) -> list[float]:
    fn()
    out = []
    for _ in range(repeats):
        t0 = clock()
        fn()
        out.append(clock() - t0)
    return out


def cuda_graph(fn):
    """``fn`` captured in a CUDA graph (replay callable), or None if it cannot be captured."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fn()
        return graph.replay
    except Exception as exc:  # report, do not fail the benchmark
        print(f"CUDA graph capture failed: {exc!r}", file=sys.stderr)
        return None


def time_cuda(fn, repeats: int) -> list[float]:
    fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end) / 1e3)
    return out


# --------------------------------------------------------------------------------------------------
# Suites


def run_worker(*args: str) -> dict:
    cmd = [sys.executable, __file__, "--worker", *args, "--threads", str(torch.get_num_threads()),
           "--clock", next(name for name, fn in CLOCKS.items() if fn is clock)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    return json.loads(res.stdout.strip().splitlines()[-1])


def cpu_suite(lengths: list[int], decode_lengths: list[int], repeats: int) -> list[dict]:
    rows = []
    for length in lengths:
        load_before = load_average()
        times = run_worker("time", "--length", str(length), "--repeats", str(repeats))
        mem = {m: run_worker(m, "--length", str(length))["peak_bytes"] for m in ("dense", "superlinear")}
        d, s = min(times["dense"]), min(times["superlinear"])
        rows.append({"op": "prefill", "L": length, "dense_s": d, "sl_s": s, "speedup": d / s,
                     "speedup_median": statistics.median(times["dense"]) / statistics.median(times["superlinear"]),
                     "dense_peak_mb": mem["dense"] / 2**20, "sl_peak_mb": mem["superlinear"] / 2**20,
                     "dense_times": times["dense"], "sl_times": times["superlinear"],
                     "load": f"{load_before} -> {load_average()}"})
    for length in decode_lengths:
        q, k, v = make_qkv(length, torch.float32, "cpu", query_len=1)
        pos = torch.tensor([length - 1])
        d = time_cpu(lambda: dense_decode(q, k, v), max(repeats, 20))
        s = time_cpu(lambda: superlinear_decode(q, q, k, v, pos, impl="gather", **PARAMS), max(repeats, 20))
        rows.append({"op": "decode", "L": length, "dense_s": min(d), "sl_s": min(s), "speedup": min(d) / min(s),
                     "speedup_median": statistics.median(d) / statistics.median(s), "load": load_average()})
    return rows


def paged_cache(k, v, block_size: int = PAGED_BLOCK_SIZE, seed: int = 0) -> PagedKV:
    """B=1 keys/values ``[1, H_KV, L, D]`` copied into a paged cache with shuffled blocks."""
    _, kv_heads, length, dim = k.shape
    blocks = -(-length // block_size)
    order = torch.randperm(blocks, generator=torch.Generator().manual_seed(seed)).to(k.device)
    key_cache = k.new_zeros((blocks, kv_heads, block_size, dim))
    value_cache = v.new_zeros((blocks, kv_heads, block_size, dim))
    pad = blocks * block_size - length
    for src, dst in ((k, key_cache), (v, value_cache)):
        padded = F.pad(src[0], (0, 0, 0, pad)).view(kv_heads, blocks, block_size, dim).transpose(0, 1)
        dst[order] = padded
    table = order.to(torch.int32)[None]
    return PagedKV.from_blocks(key_cache, value_cache, table, torch.tensor([length], device=k.device))


def paged_fn(kind: str, q, k, v):
    """The Triton paged entry point over ``paged_cache(k, v)``, output preallocated (as an engine's)."""
    kv = paged_cache(k, v)
    if kind == "prefill":
        query = q[0].transpose(0, 1)  # [L, H_Q, D], a strided view as an engine's flattened rows
        starts = torch.tensor([0, query.shape[0]], device=q.device)
        out = torch.empty_like(query)
        return lambda: superlinear_attention_paged(query, kv, starts, impl="triton", out=out, **PARAMS)
    query = q[:, :, 0]  # [1, H_Q, D]
    out = torch.empty_like(query)
    return lambda: superlinear_decode_paged(query, kv, impl="triton", out=out, **PARAMS)


def gpu_suite(lengths: list[int], decode_lengths: list[int], repeats: int, dry_run: bool) -> list[dict]:
    if dry_run:
        device, dtype, timer = "cpu", torch.float32, time_cpu  # interpreter: fp32 (bf16 dots unsupported)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("--gpu needs a CUDA device (or add --dry-run)")
        device, dtype, timer = "cuda", torch.bfloat16, time_cuda
    from torch.nn.attention import SDPBackend, sdpa_kernel

    peaks = next((v for k, v in GPU_PEAKS.items() if k in machine().get("gpu", "")), None)
    rows = []

    def dense_call(fn, q, k, v):
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            try:
                return fn(q, k, v)
            except RuntimeError:  # a flash build without GQA: repeat K/V (costs memory, not time)
                group = q.shape[1] // k.shape[1]
                return fn(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1))

    ops = (("prefill", lengths), ("prefill-paged", lengths), ("decode", decode_lengths),
           ("decode-paged", decode_lengths))
    for op, lens in ops:
        kind, paged = op.split("-")[0], op.endswith("-paged")
        for length in lens:
            q, k, v = make_qkv(length, dtype, device, query_len=None if kind == "prefill" else 1)
            if kind == "prefill":
                dense_fn = lambda q=q, k=k, v=v: dense_call(lambda a, b, c: F.scaled_dot_product_attention(  # noqa: E731
                    a, b, c, is_causal=True, enable_gqa=True), q, k, v)
                sl_fn = lambda q=q, k=k, v=v: superlinear_attention(q, q, k, v, impl="triton", **PARAMS)  # noqa: E731
            else:
                pos = torch.tensor([length - 1], device=device)
                dense_fn = lambda q=q, k=k, v=v: dense_call(lambda a, b, c: F.scaled_dot_product_attention(  # noqa: E731
                    a, b, c, enable_gqa=True), q, k, v)
                sl_fn = lambda q=q, k=k, v=v, pos=pos: superlinear_decode(  # noqa: E731
                    q, q, k, v, pos, impl="triton", **PARAMS)
            if paged:  # the same keys in a shuffled paged cache, read through the block table
                sl_fn = paged_fn(kind, q, k, v)
            check = None
            if dry_run:  # the interpreted kernels must agree with the gather implementation
                ref = (superlinear_attention(q, q, k, v, impl="gather", **PARAMS) if kind == "prefill"
                       else superlinear_decode(q, q, k, v, pos, impl="gather", **PARAMS))
                got = sl_fn()
                got = got.transpose(0, 1)[None] if paged and kind == "prefill" else got
                check = float((got.float().reshape(ref.shape) - ref.float()).abs().max())
            d = statistics.median(timer(dense_fn, repeats))
            s = statistics.median(timer(sl_fn, repeats))
            fl = floors(kind, length, torch.finfo(dtype).bits // 8)
            row = {"op": op, "L": length, "dense_s": d, "sl_s": s, "speedup": d / s, **fl}
            if kind == "decode" and device == "cuda":
                # A serving engine replays decode steps from CUDA graphs: launch overhead excluded.
                dg, sg = cuda_graph(dense_fn), cuda_graph(sl_fn)
                if dg and sg:
                    row["dense_graph_s"] = statistics.median(timer(dg, max(repeats, 20)))
                    row["sl_graph_s"] = statistics.median(timer(sg, max(repeats, 20)))
            if peaks:
                row["dense_floor_s"] = max(fl["dense_flops"] / peaks[0], fl["dense_bytes"] / peaks[1])
                row["sl_floor_s"] = max(fl["sl_flops"] / peaks[0], fl["sl_bytes"] / peaks[1])
            if check is not None:
                row["max_abs_diff_vs_gather"] = check
            rows.append(row)
            del q, k, v
            if device == "cuda":
                torch.cuda.empty_cache()
    return rows


# --------------------------------------------------------------------------------------------------
# Output


def fmt_len(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 and n < 2**20 else (f"{n // 2**20}M" if n % 2**20 == 0 else str(n))


def fmt_s(x: float) -> str:
    return f"{x * 1e3:.3g} ms" if x < 1 else f"{x:.3g} s"


def table_rows(rows: list[dict], gpu: bool) -> tuple[list[str], list[list[str]]]:
    head = ["op", "L", "dense", "superlinear", "speedup"]
    if not gpu:
        head += ["speedup (medians)", "dense peak", "superlinear peak", "load avg"]
    else:
        head += ["graphs: dense / sl / speedup", "dense GFLOP", "sl GFLOP", "dense MB", "sl MB",
                 "dense floor", "sl floor"]
    body = []
    for r in rows:
        line = [r["op"], fmt_len(r["L"]), fmt_s(r["dense_s"]), fmt_s(r["sl_s"]), f"{r['speedup']:.2f}x"]
        if not gpu:
            line += [f"{r['speedup_median']:.2f}x",
                     f"{r['dense_peak_mb']:.0f} MiB" if "dense_peak_mb" in r else "-",
                     f"{r['sl_peak_mb']:.0f} MiB" if "sl_peak_mb" in r else "-", r.get("load", "")]
        else:
            graphs = "-"
            if "sl_graph_s" in r:
                graphs = (f"{fmt_s(r['dense_graph_s'])} / {fmt_s(r['sl_graph_s'])} / "
                          f"{r['dense_graph_s'] / r['sl_graph_s']:.2f}x")
            line += [graphs, f"{r['dense_flops'] / 1e9:.4g}", f"{r['sl_flops'] / 1e9:.4g}",
                     f"{r['dense_bytes'] / 2**20:.4g}", f"{r['sl_bytes'] / 2**20:.4g}",
                     fmt_s(r["dense_floor_s"]) if "dense_floor_s" in r else "-",
                     fmt_s(r["sl_floor_s"]) if "sl_floor_s" in r else "-"]
        body.append(line)
    return head, body


def print_table(title: str, head: list[str], body: list[list[str]]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for h in head:
            table.add_column(h, justify="right" if h not in ("op",) else "left")
        for line in body:
            table.add_row(*line)
        Console(width=max(160, Console().width)).print(table)
    except ImportError:
        print(title)
        widths = [max(len(h), *(len(line[i]) for line in body)) for i, h in enumerate(head)]
        print("  ".join(h.rjust(w) for h, w in zip(head, widths)))
        for line in body:
            print("  ".join(c.rjust(w) for c, w in zip(line, widths)))


def markdown(head: list[str], body: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(line) + " |" for line in body]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", action="store_true", help="Triton kernels vs SDPA flash on a CUDA device")
    ap.add_argument("--dry-run", action="store_true", help="with --gpu: tiny sizes on CPU under TRITON_INTERPRET=1")
    ap.add_argument("--lengths", type=int, nargs="*", help="prefill lengths")
    ap.add_argument("--decode-lengths", type=int, nargs="*", help="decode cache lengths")
    ap.add_argument("--repeats", type=int, default=5, help="timed calls per method (the table shows the fastest)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--markdown", action="store_true", help="also print a markdown table")
    ap.add_argument("--threads", type=int, help="CPU: torch threads (default: torch's, the core count)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                    help="CPU: what a timing reads: wall time, or this process's CPU time (for 1-thread "
                         "runs on a shared machine)")
    ap.add_argument("--worker", choices=["dense", "superlinear", "time"], help=argparse.SUPPRESS)
    ap.add_argument("--length", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.worker == "time":
        print(json.dumps(worker_cpu_time(args.length, args.repeats)))
        return 0
    if args.worker:
        print(json.dumps(worker_cpu_memory(args.worker, args.length)))
        return 0
    if args.dry_run and not args.gpu:
        ap.error("--dry-run goes with --gpu")

    info = machine()
    if args.gpu:
        if args.dry_run:
            lengths = args.lengths or [128, 256]
            decode_lengths = args.decode_lengths if args.decode_lengths is not None else [256, 512]
        else:
            lengths = args.lengths or [2**15, 2**16, 2**17, 2**18, 2**19, 2**20]
            decode_lengths = args.decode_lengths if args.decode_lengths is not None else [2**17, 2**18, 2**19, 2**20]
        rows = gpu_suite(lengths, decode_lengths, 1 if args.dry_run else args.repeats, args.dry_run)
        title = ("Triton (interpreter dry run, fp32, times meaningless)" if args.dry_run
                 else "Triton vs SDPA flash (bf16)")
    else:
        lengths = args.lengths or [4096, 16384, 32768]
        decode_lengths = args.decode_lengths if args.decode_lengths is not None else lengths
        rows = cpu_suite(lengths, decode_lengths, args.repeats)
        title = "CPU: gather implementation vs dense causal SDPA (fp32)"
        if args.clock == "cpu":
            title += ", process CPU time"
    title += f"  B={BATCH} H_Q={HEADS} H_KV={KV_HEADS} D={DIM} " + " ".join(f"{k}={v}" for k, v in PARAMS.items())
    desc = ", ".join(f"{k}={v}" for k, v in info.items())
    head, body = table_rows(rows, args.gpu)
    print_table(title, head, body)
    print(f"machine: {desc}")
    if args.dry_run:
        worst = max(r.get("max_abs_diff_vs_gather", 0.0) for r in rows)
        print(f"dry run: Triton kernels ran interpreted; max |triton - gather| = {worst:.2e}")
        if worst > 1e-4:
            print("dry run FAILED: Triton and gather disagree")
            return 1
    if args.markdown:
        print()
        print(markdown(head, body))
    if args.json:
        args.json.write_text(json.dumps({"title": title, "machine": info, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
