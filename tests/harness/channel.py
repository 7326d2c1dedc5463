"""A driver's result travels through a file of its own, never through stdout or stderr.

Engines, their libraries and their worker processes write to stdout and stderr whenever they like; a
JSON result printed there can be cut by another write (seen under load: a line break at exactly 64 KiB
of a pipe). So a driver subprocess writes its result, whole, to the file named by ``RESULT_ENV`` (a
temp file and a rename: a reader sees all or nothing), and its stdout and stderr are only logs.

Standard library only: drivers import this module inside the engine venvs.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

RESULT_ENV = "TOOLKIT_TEST_RESULT_FILE"
# For ``python -c`` probes that cannot import this module: the same write, inline.
WRITE_RESULT_SNIPPET = (
    "def write_result(obj):\n"
    "    import json, os\n"
    f"    path = os.environ[{RESULT_ENV!r}]\n"
    "    with open(path + '.tmp', 'w') as handle:\n"
    "        json.dump(obj, handle)\n"
    "    os.replace(path + '.tmp', path)\n"
)


def write_result(obj: Any) -> None:
    """In the driver: hand ``obj`` (JSON-able) back to the test."""
    path = os.environ[RESULT_ENV]
    with open(path + ".tmp", "w") as handle:
        json.dump(obj, handle)
    os.replace(path + ".tmp", path)


@dataclass
class DriverRun:
    returncode: int
    stdout: str  # logs only
    stderr: str  # logs only
    result: Any  # what the driver handed back, or None when it wrote nothing

    def ok(self) -> Any:
        """The result of a run that must have succeeded; the failure message carries the logs' tails."""
        assert self.returncode == 0, f"driver exited {self.returncode}:\n{self.stderr[-4000:]}\n{self.stdout[-1000:]}"
        assert self.result is not None, f"driver exited 0 without a result:\n{self.stderr[-4000:]}"
        return self.result


def run_driver(argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 600,
               cwd: str | None = None) -> DriverRun:
    """Run ``argv`` with a fresh result file; return its exit code, logs and result."""
    with tempfile.TemporaryDirectory(prefix="toolkit-driver-") as tmp:
        result_file = Path(tmp) / "result.json"
        full_env = dict(os.environ if env is None else env)
        full_env[RESULT_ENV] = str(result_file)
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=full_env, timeout=timeout, cwd=cwd)
        result = json.loads(result_file.read_text()) if result_file.is_file() else None
    return DriverRun(proc.returncode, proc.stdout, proc.stderr, result)
