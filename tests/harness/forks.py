"""Driver runs as forks of one engine interpreter (tests/harness/fork_server.py), each like a subprocess.

``ForkServer(python, env).run(argv)`` gives what ``channel.run_driver([python, *argv])`` gives (exit
code, logs, result file), but each run is a fork of a server that has already imported the third-party
libraries the drivers use, so it pays only for the engine's own modules, which it reads from the disk
as a fresh interpreter would (a patch applied or reverted between two runs is seen by the second).

Which libraries: the first run of a server writes the modules it imported to a list kept under the
toolkit cache (``driver-preload/KEY.txt``); the server imports that list before the next run, and later
servers with the same key import it at their start. The list is only a speed-up: a stale or foreign
one costs at most a module the child then imports itself.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Mapping, Sequence

from tests.harness.channel import RESULT_ENV, DriverRun

FORK_SERVER = Path(__file__).with_name("fork_server.py")


class ForkServer:
    """One engine interpreter serving driver runs; a ``with`` block or ``close()`` ends it."""

    def __init__(self, python: str, *, env: Mapping[str, str], key: str, cache_dir: Path, cwd: str = "/") -> None:
        self.python = python
        self.env = dict(env)
        self.cwd = cwd
        self.modules_list = cache_dir / "driver-preload" / f"{key}.txt"
        self.tmp = Path(tempfile.mkdtemp(prefix="toolkit-forks-"))
        self.log_path = self.tmp / "server.log"
        self.process: subprocess.Popen | None = None
        self.preloaded = False

    def __enter__(self) -> "ForkServer":
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def start(self) -> None:
        read_end, write_end = os.pipe()
        with open(self.log_path, "w") as log:
            self.process = subprocess.Popen(
                [self.python, str(FORK_SERVER), str(write_end)], stdin=subprocess.PIPE, stdout=log,
                stderr=subprocess.STDOUT, pass_fds=(write_end,), env=self.env, cwd=self.cwd, text=True,
                start_new_session=True)  # its own process group: close() ends its children too
        os.close(write_end)
        self._replies = os.fdopen(read_end)
        if self.modules_list.is_file():
            self._preload(timeout=600)

    def run(self, argv: Sequence[str], *, timeout: float = 600, env: Mapping[str, str] | None = None,
            unset: Sequence[str] = (), pythonpath: str | None = None) -> DriverRun:
        """Run ``argv`` (a script and its arguments) in a fork; like ``run_driver([python, *argv])``. The
        fork's environment is the server's without the variables in ``unset``, with those of ``env``; with
        ``pythonpath``, the fork imports from that path instead of the server's ``PYTHONPATH`` (another
        copy of the engine over the same libraries: tests/patches/sglang/group_runs.py)."""
        runs = self.tmp / f"run-{len(list(self.tmp.glob('run-*')))}"
        runs.mkdir()
        learn = not self.preloaded
        request = {"run": [str(a) for a in argv], "unset": list(unset),
                   "env": {**(env or {}), RESULT_ENV: str(runs / "result.json")},
                   "stdout": str(runs / "stdout"), "stderr": str(runs / "stderr"),
                   "modules": str(runs / "modules.txt") if learn else None, "pythonpath": pythonpath}
        returncode = self._ask(request, timeout)["returncode"]
        result_file = runs / "result.json"
        result = json.loads(result_file.read_text()) if result_file.is_file() else None
        if learn and (runs / "modules.txt").is_file():
            self.modules_list.parent.mkdir(parents=True, exist_ok=True)
            partial = self.modules_list.with_name(f".{self.modules_list.name}.{os.getpid()}")
            partial.write_bytes((runs / "modules.txt").read_bytes())
            os.replace(partial, self.modules_list)  # atomic: the other test worker may read it
            self._preload(timeout=600)
        return DriverRun(returncode, (runs / "stdout").read_text(errors="replace"),
                         (runs / "stderr").read_text(errors="replace"), result)

    def close(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        try:
            process.stdin.close()
            process.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # a child left behind, or a server that hung
            except (ProcessLookupError, PermissionError):
                pass
            process.wait()
            self._replies.close()
            shutil.rmtree(self.tmp, ignore_errors=True)  # the runs' logs: already handed back

    def _preload(self, timeout: float) -> None:
        self._ask({"preload": str(self.modules_list)}, timeout)
        self.preloaded = True

    def _ask(self, request: dict, timeout: float) -> dict:
        assert self.process is not None, "the fork server is not running"
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
        except OSError:  # a broken pipe: it died; said below with its log
            ready, line = True, ""
        else:
            ready, _, _ = select.select([self._replies], [], [], timeout)
            line = self._replies.readline() if ready else ""
        if not line:
            log = self.log_path.read_text(errors="replace")[-4000:]
            self.close()
            raise AssertionError(f"fork server {'timed out after %ds' % timeout if not ready else 'died'} on "
                                 f"{request}:\n{log}")
        return json.loads(line)
