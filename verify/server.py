"""Start an engine's real OpenAI-compatible server, wait until it is healthy, and stop all of it.

    with EngineServer("vllm", python, model_dir) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="none")

The server runs under the given interpreter (an engine venv's python), in its own process group and
its own temporary directory (TMPDIR, HF_HOME and the engines' cache roots point inside it; the hub
is off), on a free loopback port, with its output in a log file. Leaving the context (normally, on an
exception or on Ctrl-C) sends SIGTERM to the process group, waits, then SIGKILLs every process of the
server that is still alive, found by PID (the process tree and group recorded while it ran), and
removes the temporary directory. Needs psutil (the `verify` extra; every engine already depends on it).

The command line, environment and cwd come from server_launch; processes finds the server's processes
by PID; modelinfo_cache keeps vLLM's model-class inspections between servers.
"""

from __future__ import annotations

import typing

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from toolkit.base.engines import ENGINES
from toolkit.verify.modelinfo_cache import modelinfo_dirs, save_modelinfos, seed_modelinfos
from toolkit.verify.processes import create_time, group_members, pid_alive, send_signal, tree_and_group
from toolkit.verify.server_launch import server_command, server_env, server_workdir

__all__ = ["EngineServer", "ServerStartError", "engine_version", "free_port", "pid_alive"]

STOP_GRACE_S = 20.0
PORT_ATTEMPTS = 3  # starts on a new port after the chosen one was taken (a race with other servers)


class ServerStartError(RuntimeError):
    """The server process died or did not become healthy in time; the message ends with its log."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message + (f"\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def engine_version(engine: str, python: str, extra_env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(distribution, version) of ``engine`` installed for ``python``, read without importing it, as the
    server will see it: ``extra_env`` (the server's own, e.g. a PYTHONPATH that puts another release's
    package first) applies to the probe too."""
    dists = ENGINES[engine].distributions
    code = (
        "import importlib.metadata as m, sys\n"
        f"for d in {dists!r}:\n"
        "    try:\n"
        "        print(d, m.version(d)); sys.exit(0)\n"
        "    except m.PackageNotFoundError:\n"
        "        pass\n"
        "sys.exit(3)\n"
    )
    env = {**os.environ, **extra_env} if extra_env else None
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    if result.returncode != 0:
        raise ServerStartError(f"{python} has no {engine} installed (looked for {', '.join(dists)})")
    dist, version = result.stdout.split()
    return dist, version


_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
_RUNNING: set["EngineServer"] = set()


@atexit.register
def _stop_all_at_exit() -> None:
    for server in list(_RUNNING):
        server.stop()


class EngineServer:
    """A real vLLM or SGLang OpenAI server for the duration of a ``with`` block."""

    def __init__(
        self,
        engine: str,
        python: str,
        model: str,
        server_args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        timeout: float = 180,
        log_path: str | os.PathLike | None = None,
        *,
        cpu: bool = True,
        host: str = "127.0.0.1",
        cwd: str | os.PathLike | None = None,
    ) -> None:
        if engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, not {engine!r}")
        self.engine = engine
        self.python = str(python)
        self.model = str(model)
        self.server_args = list(server_args)
        self.extra_env = dict(env or {})
        self.timeout = timeout
        self.cpu = cpu
        self.host = host
        # the server's working directory (first on its sys.path under `python -m`): an empty one of its own
        # unless given (a test starts one from a folder with a `toolkit/` of its own, issue 49)
        self.cwd = Path(cwd) if cwd is not None else None
        self.port: int | None = None
        self.tmp_dir: Path | None = None
        self.log_path: Path | None = Path(log_path) if log_path else None
        self.distribution: str | None = None
        self.version: str | None = None
        self.command: list[str] = []
        self.process: subprocess.Popen | None = None
        self.seen_pids: dict[int, float] = {}  # pid -> create_time of every server process seen
        self._log_handle: typing.TextIO | None = None
        self._final_log: str = ""
        self._stopped = False
        self._root_start: float | None = None

    # --- public ---------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def process_tree(self) -> list[int]:
        """PIDs of the server and all its processes now (also remembered for the stop)."""
        if self.process is None:
            return []
        if self._group_alive():
            root = self.process.pid if self.process.returncode is None else None
            self.seen_pids.update(tree_and_group(root, self.process.pid))
        return sorted(pid for pid, start in self.seen_pids.items() if pid_alive(pid, start))

    def log_tail(self, n: int = 40) -> str:
        text = self._final_log
        if self.log_path is not None and self.log_path.is_file():
            text = self.log_path.read_text(errors="replace")
        return "\n".join(text.splitlines()[-n:])

    def __enter__(self) -> "EngineServer":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def start(self) -> None:
        if self.process is not None:
            raise RuntimeError("server already started")
        # The server's environment decides which release it runs (a private copy first on its PYTHONPATH):
        # the version picks its flags and the kept model-class inspections it shares.
        self.distribution, self.version = engine_version(self.engine, self.python, self.extra_env)
        # A short name: Ray puts its AF_UNIX sockets (107 bytes at most) in the server's TMPDIR, ~70 bytes down
        # (tmp/ray/session_<date>_<time>_<pid>/sockets/plasma_store); under "toolkit-vllm-server-..." a TMPDIR
        # a few characters longer than /tmp failed `--distributed-executor-backend ray` at start.
        self.tmp_dir = Path(tempfile.mkdtemp(prefix=f"tk-{self.engine}-"))
        try:
            if self.log_path is None:
                self.log_path = self.tmp_dir / "server.log"
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self._log_handle = open(self.log_path, "w")
            _RUNNING.add(self)
            env = server_env(self.engine, self.tmp_dir, self.extra_env, cpu=self.cpu)
            self._seed_modelinfos()  # before the start: vLLM reads its cache root as it starts
            for attempt in range(1, PORT_ATTEMPTS + 1):
                log_start = self._log_handle.tell()
                self._launch(env)
                try:
                    self._wait_healthy()
                    break
                except ServerStartError:
                    # A free port is free only when asked: another server's own sockets (SGLang's ZMQ and
                    # rendezvous ports, vLLM's) may take it before this one binds. That, and only that, is
                    # tried again on a new port; the log keeps every attempt.
                    if attempt == PORT_ATTEMPTS or not self._port_was_taken(log_start):
                        raise
                    self._discard_process()
                    self._log_handle.write(f"# port {self.port} was taken before the server bound it; "
                                           f"starting again on another (attempt {attempt + 1})\n")
                    self._log_handle.flush()
        except BaseException:
            self.stop()
            raise
        self._save_modelinfos()  # healthy: vLLM has inspected the model class by now

    def stop(self) -> None:
        """SIGTERM the process group, wait, SIGKILL what remains by PID, remove the temp dir."""
        process = self.process
        if process is not None and not self._stopped:
            # Marked stopped only at the end: a second Ctrl-C in here leaves it to the atexit hook.
            if process.returncode is None:  # not reaped yet, so its pid (= pgid) is still ours
                self.seen_pids.update(tree_and_group(process.pid, process.pid))
            self._signal_all(signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            while self._alive() and time.monotonic() < deadline:
                try:
                    process.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
            if self._alive():
                self._signal_all(signal.SIGKILL)
                deadline = time.monotonic() + 10
                while self._alive() and time.monotonic() < deadline:
                    try:
                        process.wait(timeout=0.1)
                    except subprocess.TimeoutExpired:
                        pass
            try:
                process.wait(timeout=1)
            except subprocess.TimeoutExpired:
                pass
            self._stopped = True
        _RUNNING.discard(self)
        if self._log_handle is not None:
            self._log_handle.close()
            self._log_handle = None
        if self.log_path is not None and self.log_path.is_file():
            self._final_log = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-400:])
        if self.tmp_dir is not None and self.tmp_dir.exists():
            if self.log_path is not None and self.tmp_dir in self.log_path.parents:
                self.log_path = None  # it goes with the temp dir; log_tail() keeps the end of it
            shutil.rmtree(self.tmp_dir, ignore_errors=True)
        # tmp_dir and seen_pids stay set, so callers can check that both are gone.

    # --- internals ------------------------------------------------------------------------

    def _launch(self, env: Mapping[str, str]) -> None:
        assert self._log_handle is not None and self.tmp_dir is not None
        self.port = free_port(self.host)
        self.command = server_command(self.engine, self.python, self.model, self.host, self.port,
                                      self.version or "", self.server_args, cpu=self.cpu)
        self._log_handle.write(f"$ {' '.join(self.command)}\n")
        self._log_handle.flush()
        self.process = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=self._log_handle,
            stderr=subprocess.STDOUT,
            env=dict(env),
            cwd=self.cwd if self.cwd is not None else server_workdir(self.tmp_dir),
            start_new_session=True,  # its own session and process group
        )
        self._root_start = create_time(self.process.pid)

    def _port_was_taken(self, log_start: int) -> bool:
        """Whether the attempt whose log begins at byte ``log_start`` died because its port was in use."""
        if self.process is None or self.process.poll() is None or self.log_path is None:
            return False  # still running (not healthy in time): not a port race
        with open(self.log_path, "rb") as log:
            log.seek(log_start)
            text = log.read().decode(errors="replace").lower()
        # the OS's words (uvicorn, vLLM, ZMQ), and SGLang's when a port of its own plan was taken
        return any(words in text for words in ("address already in use", "errno 98", "port is already in use"))

    def _discard_process(self) -> None:
        """Kill what is left of a failed attempt (its pids stay remembered for the final stop)."""
        assert self.process is not None
        self._signal_all(signal.SIGKILL)
        deadline = time.monotonic() + 10
        while self._alive() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.process = None

    def _alive(self) -> bool:
        return any(pid_alive(pid, start) for pid, start in self.seen_pids.items())

    def _group_alive(self) -> bool:
        """Whether the server's process group still has members (and its id was not reused)."""
        assert self.process is not None
        if self.process.returncode is None:
            return True  # the leader is not reaped: its pid, the group id, is still ours
        pgid = self.process.pid
        leader = create_time(pgid)
        if leader is not None and leader != self._root_start:
            return False  # that pid now names another process; a group with its id is not ours
        return bool(group_members(pgid))

    def _signal_all(self, sig: int) -> None:
        """``sig`` to the process group and to every server process seen, each checked by PID."""
        assert self.process is not None
        if self._group_alive():
            # Members that appeared since the last look (they keep the group id when orphaned); the
            # descendant walk only while the root is unreaped, since a reaped pid may be reused.
            root = self.process.pid if self.process.returncode is None else None
            self.seen_pids.update(tree_and_group(root, self.process.pid))
            try:
                os.killpg(self.process.pid, sig)  # start_new_session: pgid == pid
            except (ProcessLookupError, PermissionError):
                pass
        for pid, start in list(self.seen_pids.items()):
            if pid_alive(pid, start):
                send_signal(pid, sig)

    def _modelinfo_dirs(self) -> tuple[Path, Path] | None:
        return modelinfo_dirs(self.engine, f"{self.distribution}-{self.version}", self.tmp_dir)

    def _seed_modelinfos(self) -> None:
        dirs = self._modelinfo_dirs()
        if dirs is not None:
            seed_modelinfos(*dirs)

    def _save_modelinfos(self) -> None:
        dirs = self._modelinfo_dirs()
        if dirs is not None:
            save_modelinfos(*dirs)

    def _wait_healthy(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.timeout
        url = self.base_url + "/health"
        while True:
            if self.process.poll() is not None:
                raise ServerStartError(
                    f"{self.engine} server exited with status {self.process.returncode} before it was healthy; "
                    f"last lines of {self.log_path}:", self.log_tail(60))
            try:
                with _NO_PROXY.open(url, timeout=5) as response:
                    if response.status == 200:
                        self.process_tree()
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ServerStartError(
                    f"{self.engine} server not healthy after {self.timeout:.0f}s; "
                    f"last lines of {self.log_path}:", self.log_tail(60))
            self.process_tree()  # remember the processes as they appear
            time.sleep(0.5)


if __name__ == "__main__":  # a manual smoke run: python -m toolkit.verify.server ENGINE PYTHON MODEL [ARGS...]
    engine_, python_, model_, *args_ = sys.argv[1:]
    with EngineServer(engine_, python_, model_, args_) as server_:
        print(f"{server_.engine} {server_.version} healthy at {server_.base_url} (pid {server_.pid}); Ctrl-C stops it")
        try:
            while server_.process and server_.process.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
