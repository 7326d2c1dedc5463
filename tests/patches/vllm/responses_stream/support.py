"""For the responses-stream tests (the scenarios, requests and private vLLM copies they share with
scripts/bench_responses_stream.py: scripts/support/responses_requests.py and vllm_private.py).

* the cases the scenarios make, and what each must produce;
* :func:`simulate`: the state machine alone, wrapped in the lifecycle events vLLM adds, as dicts;
* :func:`serve_and_play`: every case against a real server on a private copy of vLLM.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from scripts.support.responses_requests import SCENARIOS, SERVER_ARGS, request_body
from scripts.support.vllm_private import private_vllm, venv_python

# (case name, scenario, extra request fields): every order of the issue, plus the cut cases.
CASES: list[tuple[str, str, dict]] = [
    *[(name, name, {}) for name in SCENARIOS],
    # reasoning only, cut by max_output_tokens
    ("reason_cut_by_length", "reason_text", {"max_output_tokens": 3}),
    # a tool call cut inside its arguments (EOS in the middle of an argument)
    ("tool_cut_mid_arguments", "reason_tool", {"max_output_tokens": SCENARIOS["reason_tool"].index("Paris") + 1}),
]


# --------------------------------------------------------------------------------------------------
# the machine alone


def _markers():
    from toolkit.patches.vllm.responses_stream.segmenter import Markers

    return Markers("<think>", "</think>", "<tool_call>", "</tool_call>")


def simulate(chunks: Sequence[str], finish_reason: str | None = "stop", *, markers: Any = "default",
             **options: Any) -> tuple[list[dict], list[dict]]:
    """Feed ``chunks`` to a fresh ResponsesStream; the whole event stream (as vLLM would send it,
    lifecycle included) and the output items, as JSON dicts."""
    from toolkit.patches.vllm.responses_stream.machine import ResponsesStream

    stream = ResponsesStream(_markers() if markers == "default" else markers, **options)
    events: list[Any] = []
    for chunk in chunks:
        events += stream.feed(chunk)
    events += stream.finish(finish_reason)
    items = [item.model_dump(mode="json") for item in stream.items]
    return wrap(events, items, "incomplete" if finish_reason == "length" else "completed"), items


def wrap(events: Sequence[Any], items: list[dict], status: str) -> list[dict]:
    """Item events between response.created / in_progress and a terminal event, numbered."""
    rid = "resp_test"
    start = {"id": rid, "object": "response", "status": "in_progress", "output": []}
    final: dict[str, Any] = {"id": rid, "object": "response", "status": status, "output": items}
    if status == "incomplete":
        final["incomplete_details"] = {"reason": "max_output_tokens"}
    out = [{"type": "response.created", "response": start}, {"type": "response.in_progress", "response": start}]
    out += [e if isinstance(e, dict) else e.model_dump(mode="json") for e in events]
    out.append({"type": f"response.{status}", "response": final})
    for number, event in enumerate(out):
        event["sequence_number"] = number
    return out


def without_ids(items: Sequence[dict]) -> list[dict]:
    return [{k: v for k, v in item.items() if k not in ("id", "call_id")} for item in items]


# --------------------------------------------------------------------------------------------------
# what each case must produce, and playing a case against a live server

EXPECTED: dict[str, list[tuple]] = {
    "reason_text": [("reasoning", "The user says hello.", "completed"), ("message", "Hello there!", "completed")],
    "reason_tool": [("reasoning", "I need the weather.", "completed"),
                    ("call", "get_weather", '{"city": "Paris"}', "completed")],
    "reason_text_tools": [("reasoning", "Two lookups.", "completed"), ("message", "Checking both.", "completed"),
                          ("call", "get_weather", '{"city": "Rome"}', "completed"),
                          ("call", "get_time", '{"zone":"CET"}', "completed")],
    "text_tool_text": [("message", "Let me check.", "completed"),
                       ("call", "get_weather", '{"city": "Oslo"}', "completed"),
                       ("message", "Done checking.", "completed")],
    "tools_only": [("call", "get_time", '{"zone":"UTC"}', "completed"),
                   ("call", "get_weather", '{"city": "Lima"}', "completed")],
    "empty_think": [("message", "Short answer.", "completed")],
    "text_only": [("message", "Plain text only.", "completed")],
    "split_opener": [("message", "Split opener.", "completed"),
                     ("call", "get_weather", '{"city": "Kyiv"}', "completed")],
    "reason_cut_by_length": [("reasoning", "The user", "incomplete")],
    "tool_cut_mid_arguments": [("reasoning", "I need the weather.", "completed"),
                               ("call", "get_weather", '{"city": "Paris', "incomplete")],
}


def summary(items: Sequence[dict]) -> list[tuple]:
    out: list[tuple] = []
    for item in items:
        kind = item.get("type")
        if kind in ("message", "reasoning"):
            out.append((kind, "".join(p.get("text", "") for p in item.get("content") or []), item.get("status")))
        elif kind == "function_call":
            out.append(("call", item.get("name"), item.get("arguments"), item.get("status")))
        else:
            out.append((kind, item.get("name"), item.get("input")))
    return out


class CaseRun:
    """One case played three ways: raw SSE stream, non-streaming, and the official openai client."""

    def __init__(self, events: list[dict], nonstream: dict, client_final: dict | None, client_error: str | None):
        self.events = events
        self.nonstream = nonstream
        self.client_final = client_final
        self.client_error = client_error

    @property
    def terminal(self) -> dict:
        return self.events[-1] if self.events else {}

    @property
    def stream_output(self) -> list[dict]:
        return list((self.terminal.get("response") or {}).get("output") or [])


def play(base_url: str, model: str, scenario: str, extra: dict | None = None) -> CaseRun:
    import httpx
    import openai

    from toolkit.verify.grammar import parse_sse

    with httpx.Client(base_url=base_url.rstrip("/") + "/v1", timeout=120) as http:
        with http.stream("POST", "/responses", json=request_body(model, scenario, extra, stream=True)) as response:
            response.raise_for_status()
            events = parse_sse(list(response.iter_lines()))
        nonstream = http.post("/responses", json=request_body(model, scenario, extra)).json()
    body = request_body(model, scenario, extra)
    client = openai.OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="none", max_retries=0)
    client_final, client_error = None, None
    try:
        with client.responses.stream(
            model=body.pop("model"), input=body.pop("input"), tools=body.pop("tools"),
            temperature=body.pop("temperature"), max_output_tokens=body.pop("max_output_tokens"), extra_body=body,
        ) as stream:
            last = None
            for event in stream:
                last = event
            if last is not None and last.type == "response.completed":
                client_final = stream.get_final_response().model_dump(mode="json")
            elif last is not None and last.type in ("response.incomplete", "response.failed"):
                client_final = last.response.model_dump(mode="json")
            else:
                client_error = f"the stream ended with {getattr(last, 'type', None)!r}"
    except Exception as exc:  # the client's own consistency checks, or a parse error
        client_error = f"{type(exc).__name__}: {exc}"
    finally:
        client.close()
    return CaseRun(events, nonstream, client_final, client_error)


def problems(case: str, run: CaseRun) -> list[str]:
    """Everything wrong with one case: grammar, client, stream vs non-stream, content."""
    from toolkit.verify.grammar import check_events, compare_outputs

    found = [f"stream: {p}" for p in check_events(run.events)]
    if run.client_error:
        found.append(f"openai client: {run.client_error}")
    nonstream_output = run.nonstream.get("output") or []
    if run.client_final is not None:
        found += [f"client final vs non-stream: {d}"
                  for d in compare_outputs(run.client_final.get("output") or [], nonstream_output, ignore_ids=True)]
    found += [f"stream vs non-stream: {d}" for d in compare_outputs(run.stream_output, nonstream_output,
                                                                    ignore_ids=True)]
    if (run.terminal.get("response") or {}).get("status") != run.nonstream.get("status"):
        found.append(f"status: stream {(run.terminal.get('response') or {}).get('status')!r}, "
                     f"non-stream {run.nonstream.get('status')!r}")
    if summary(nonstream_output) != EXPECTED[case]:
        found.append(f"content: non-stream items {summary(nonstream_output)!r}, expected {EXPECTED[case]!r}")
    return found


def play_background(base_url: str, model: str, scenario: str, extra: dict | None = None) -> list[dict]:
    """A background streaming request (the server needs VLLM_ENABLE_RESPONSES_API_STORE=1): its events."""
    import httpx

    from toolkit.verify.grammar import parse_sse

    body = {**request_body(model, scenario, extra, stream=True), "background": True, "store": True}
    with httpx.Client(base_url=base_url.rstrip("/") + "/v1", timeout=httpx.Timeout(60, read=30)) as http:
        with http.stream("POST", "/responses", json=body) as response:
            response.raise_for_status()
            return parse_sse(list(response.iter_lines()))


BACKGROUND_CASES = ["reason_text_tools", "tool_cut_mid_arguments"]


def play_all(base_url: str, model: str, background: bool = False) -> dict[str, Any]:
    runs: dict[str, Any] = {case: play(base_url, model, scenario, extra) for case, scenario, extra in CASES}
    if background:
        by_name = {case: (scenario, extra) for case, scenario, extra in CASES}
        for case in BACKGROUND_CASES:
            try:
                runs[f"background:{case}"] = play_background(base_url, model, *by_name[case])
            except Exception as exc:  # e.g. a stream that never ends (read timeout)
                runs[f"background:{case}"] = f"{type(exc).__name__}: {exc}"
    return runs


def serve_and_play(model: str, patched: bool, log_path: Path | None = None,
                   version: str = "0.32.0") -> dict[str, CaseRun]:
    """Start one real vLLM ``version`` server (our private copy, patched or not), play every case, stop it."""
    from tests.harness.fixtures import VLLM_NO_WORKER_PROCESS
    from toolkit.verify.server import EngineServer

    with private_vllm(["responses-stream"] if patched else [], version=version) as overlay:
        # responses-stream edits only the API server's files: no worker process
        env = {"PYTHONPATH": str(overlay), "VLLM_ENABLE_RESPONSES_API_STORE": "1", **VLLM_NO_WORKER_PROCESS}
        with EngineServer("vllm", str(venv_python()), model, SERVER_ARGS, env=env, timeout=600,
                          log_path=log_path) as server:
            return play_all(server.base_url, model, background=patched)
