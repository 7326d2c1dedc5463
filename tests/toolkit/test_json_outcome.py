"""Issue 57, "--json and Ctrl-C": every exit of a ``--json`` command is one JSON object on stdout whose
``"ok"`` is true exactly when the exit code is 0, wherever the signal (SIGINT, SIGTERM) lands: while the
command line loads (before its first line: exit 130 with an empty stdout before), in the middle of the
object, or just after it (``"ok": true`` with exit 130 before). The deterministic cases put the signal at
a named point from inside the child; the random case sends real signals from outside at random moments.
The handler is :mod:`toolkit.base.outcome`'s, installed by ``toolkit.__main__.run`` first thing.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.toolkit import demo_patches
from tests.toolkit.test_output_and_arguments import ROOT, apply_demo, child_argv, no_traceback, toolkit

SIGNALS = [signal.SIGINT, signal.SIGTERM]
COMMANDS = [["status", "--json"], ["revert", "--json"], ["apply-patch", "--json"]]


@pytest.fixture
def site(tmp_path) -> Path:
    return demo_patches.make_engine_tree(tmp_path / "site")


def one_object(proc: subprocess.CompletedProcess) -> dict:
    """The one JSON object of the run (json.loads refuses a second one or a cut one), its "ok" true
    exactly when the exit code is 0."""
    no_traceback(proc)
    try:
        payload = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"exit {proc.returncode}, stdout not one JSON object: {proc.stdout!r}; "
                             f"stderr: {proc.stderr!r}") from None
    assert payload["ok"] is (proc.returncode == 0), (proc.returncode, payload)
    return payload


def ready(site: Path, argv: list[str]) -> None:
    """revert needs something applied to revert."""
    if argv[0] == "revert":
        apply_demo(site)


# A signal the moment the command line starts loading: run() has begun, nothing of toolkit.cli is there.
WHILE_LOADING = """
import os, signal, sys
class Finder:
    def find_spec(self, name, path=None, target=None):
        if name == "toolkit.cli":
            os.kill(os.getpid(), {signum})
sys.meta_path.insert(0, Finder())
"""

# In the middle of writing the object (half of it out), and just after it is out.
WHILE_WRITING = """
import os, signal
from toolkit.cli import output
write = output.StdoutFile.write
def split(self, text):
    half = len(text) // 2
    write(self, text[:half])
    os.kill(os.getpid(), {signum})
    return write(self, text[half:])
output.StdoutFile.write = split
"""

AFTER_WRITING = """
import os, signal, time
from toolkit.cli import output
emit = output.emit_json
def emit_json(*args, **kwargs):
    emit(*args, **kwargs)
    os.kill(os.getpid(), {signum})
    time.sleep(2)  # the handler runs before this returns
output.emit_json = emit_json
"""


# each command and each signal at each point, not every pairing (each case is a child of about a second)
@pytest.mark.parametrize(("argv", "signum"), list(zip(COMMANDS, [signal.SIGTERM, signal.SIGINT, signal.SIGTERM])),
                         ids=lambda a: a[0] if isinstance(a, list) else signal.Signals(a).name)
def test_a_signal_while_the_command_line_loads_is_one_object(site, argv, signum):
    ready(site, argv)
    before = (site / "sglang/srt/serving.py").read_bytes()
    proc = toolkit(site, *argv, hook=WHILE_LOADING.format(signum=int(signum)))
    payload = one_object(proc)
    assert proc.returncode == 130 and payload["kind"] == "interrupted" and payload["interrupted"] is True
    assert (site / "sglang/srt/serving.py").read_bytes() == before  # nothing ran


@pytest.mark.parametrize(("argv", "signum", "hook"), [
    (["status", "--json"], signal.SIGINT, WHILE_WRITING), (["apply-patch", "--json"], signal.SIGTERM, WHILE_WRITING),
    (["status", "--json"], signal.SIGTERM, AFTER_WRITING), (["revert", "--json"], signal.SIGINT, AFTER_WRITING),
    (["apply-patch", "--json"], signal.SIGINT, AFTER_WRITING)],
    ids=["status-SIGINT-while-writing", "apply-patch-SIGTERM-while-writing", "status-SIGTERM-after-writing",
         "revert-SIGINT-after-writing", "apply-patch-SIGINT-after-writing"])
def test_a_signal_once_the_object_is_started_keeps_its_exit_code(site, argv, signum, hook):
    """The object is the outcome: whole, and the exit code it stands for (0 here), never 130 after it."""
    ready(site, argv)
    proc = toolkit(site, *argv, hook=hook.format(signum=int(signum)))
    payload = one_object(proc)
    assert proc.returncode == 0 and "interrupted" not in payload, (proc.returncode, payload)


def test_a_usage_error_object_keeps_exit_2_after_a_signal(site):
    proc = toolkit(site, "status", "--json", "--no-such-option", hook=AFTER_WRITING.format(signum=int(signal.SIGINT)))
    payload = one_object(proc)
    assert proc.returncode == 2 and payload["kind"] == "usage"


def _handler_installed(pid: int) -> bool:
    """Whether the process catches SIGTERM (Python leaves it at its default: only toolkit's handler
    catches it), read from /proc; False once the process is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    caught = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:")), 16)
    return bool(caught >> (signal.SIGTERM - 1) & 1)


# a longer loop sets TOOLKIT_SIGNAL_RUNS; --quick runs 4 (both signals still sent)
RUNS = int(os.environ.get("TOOLKIT_SIGNAL_RUNS", "4" if os.environ.get("TOOLKIT_QUICK") == "1" else "8"))


def test_real_signals_at_random_moments_give_one_object(site):
    """A bounded loop: apply-patch, revert and status --json, each sent SIGINT or SIGTERM from outside at a
    random moment between toolkit's first line (its handler is in place: before it the interpreter itself
    is starting, and dies by the signal with nothing printed) and a little after the command's usual end.
    Every run is one object, "ok" exactly when exit 0, 130 when interrupted."""
    rng = random.Random(int(os.environ.get("TOOLKIT_SIGNAL_SEED", "57")))
    start = time.monotonic()
    unsignalled = subprocess.run(child_argv(site, "status", "--json"), cwd=ROOT, capture_output=True, text=True,
                                 timeout=120)
    duration = time.monotonic() - start
    assert one_object(unsignalled)["ok"] is True
    seen: dict[str, int] = {}
    for run in range(RUNS):
        argv, signum = COMMANDS[run % 3], SIGNALS[run // 3 % 2]
        proc = subprocess.Popen(child_argv(site, *argv), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        deadline = time.monotonic() + 60
        while not _handler_installed(proc.pid):
            assert proc.poll() is None, f"{argv} ended without ever catching SIGTERM"
            assert time.monotonic() < deadline
            time.sleep(0.002)
        time.sleep(rng.uniform(0, duration * 1.2))
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
        done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        payload = one_object(done)
        assert done.returncode in (0, 130), (done.returncode, payload)
        assert (done.returncode == 130) is bool(payload.get("interrupted")), payload
        key = f"exit {done.returncode}"
        seen[key] = seen.get(key, 0) + 1
    print(f"{RUNS} runs: {seen}")
