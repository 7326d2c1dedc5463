"""Runs driver scripts in forks of one engine interpreter that has imported their libraries once.

    <engine python> fork_server.py REPLY_FD

Importing SGLang's serving layer is 11-15 s of a 16-19 s drive, and ~90% of that is its third-party
libraries (torch, transformers, fastapi, ...), which no patch edits. This server imports those once
(``preload``), then runs each driver in a fork of itself (``run``): the child imports only what is not
there yet, the engine's own modules included, so a patched file is always read fresh from the disk.
Never preloaded: the engine itself and anything of ours (``NEVER``), which the patches edit or inject.

Requests are JSON lines on stdin; each gets one JSON line on the file descriptor REPLY_FD (stdout and
stderr are logs: libraries print there):

* ``{"preload": PATH}``: import each module named in PATH (a line each, in import order); a module that
  fails is skipped (the child imports it itself). Reply ``{"imported": N, "skipped": M}``.
* ``{"run": [SCRIPT, ARG...], "unset": [NAME...], "env": {...}, "stdout": PATH, "stderr": PATH,
  "modules": PATH|null, "pythonpath": STR|null}``: fork; the child removes the variables named in
  ``unset`` from its environment and sets ``env``; with ``pythonpath``, its ``sys.path`` and
  ``PYTHONPATH`` have that path where the server's own ``PYTHONPATH`` was (a server shared by engine
  copies over the same libraries: each run imports its own copy's engine); it sends its output to the
  two files and runs SCRIPT as ``__main__``, then
  writes the modules it has imported that may be preloaded to ``modules``. Reply ``{"returncode": N}``
  (negative: the signal that ended it).

Standard library only: it runs inside the engine venvs. Not a test module (tests/harness/forks.py
drives it).
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import runpy
import sys
import traceback

# The engine's packages and ours: a patch edits or injects these, so every child imports them itself.
NEVER = ("sglang", "vllm", "toolkit", "tests", "__main__", "__mp_main__")
# The server's own PYTHONPATH entries, as the interpreter put them on sys.path at its start.
SERVER_PYTHONPATH = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]


def may_preload(name: str) -> bool:
    return name.split(".", 1)[0] not in NEVER


def preload(path: str) -> dict:
    imported = skipped = 0
    with open(path) as handle:
        names = [line.strip() for line in handle if line.strip()]
    for name in names:
        if not may_preload(name) or name in sys.modules:
            continue
        try:
            __import__(name)
            imported += 1
        except BaseException:  # noqa: BLE001 - only a speed-up: the child imports it (and fails) itself
            skipped += 1
    return {"imported": imported, "skipped": skipped}


def use_pythonpath(pythonpath: str) -> None:
    """``pythonpath`` in place of the server's own on ``sys.path`` (where the interpreter put it: after the
    script's folder, before the standard library) and in the environment (for the child's subprocesses)."""
    entries = [entry for entry in pythonpath.split(os.pathsep) if entry]
    rest = [entry for entry in sys.path[1:] if entry not in SERVER_PYTHONPATH]
    sys.path[:] = [sys.path[0], *entries, *rest]
    os.environ["PYTHONPATH"] = pythonpath
    importlib.invalidate_caches()


def child(request: dict) -> None:
    """In the fork: become the driver process; never returns."""
    code = 0
    try:
        for name in request.get("unset") or ():
            os.environ.pop(name, None)
        os.environ.update(request.get("env") or {})
        if request.get("pythonpath") is not None:
            use_pythonpath(request["pythonpath"])
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, key in ((1, "stdout"), (2, "stderr")):
            out = os.open(request[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
            os.close(out)
        script, *args = request["run"]
        sys.argv = [script, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` has it
        try:
            runpy.run_path(script, run_name="__main__")
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if exc.code is not None and not isinstance(exc.code, int):
                print(exc.code, file=sys.stderr)
        modules = request.get("modules")
        if modules:
            with open(modules + ".tmp", "w") as handle:
                handle.writelines(f"{name}\n" for name in list(sys.modules) if may_preload(name))
            os.replace(modules + ".tmp", modules)
    except BaseException:  # noqa: BLE001 - the driver's failure, reported as `python SCRIPT` would
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # what the interpreter's shutdown would run
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def serve(reply_fd: int) -> None:
    reply = os.fdopen(reply_fd, "w", buffering=1)
    for line in sys.stdin:
        request = json.loads(line)
        if "preload" in request:
            answer = preload(request["preload"])
        else:
            pid = os.fork()
            if pid == 0:
                child(request)
            _, status = os.waitpid(pid, 0)
            answer = {"returncode": os.waitstatus_to_exitcode(status)}
        reply.write(json.dumps(answer) + "\n")


if __name__ == "__main__":
    serve(int(sys.argv[1]))
