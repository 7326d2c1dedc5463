"""The command line's outcome, decided once: the exit code and, under ``--json``, the one object on stdout.

A signal (Ctrl-C, SIGTERM, SIGHUP) can land anywhere: while the interpreter loads the command line,
while the command runs, in the middle of writing its object, or after it. :func:`on_signal` (installed by
``toolkit.__main__`` before anything heavy is imported) makes each of these one outcome:

* before the object: ``{"ok": false, "kind": "interrupted", ...}`` (with what apply-patch or revert
  committed, :data:`INTERRUPTED`) and exit 130, whichever of the three it was;
* while the object is being written: the signal waits until it is whole, then as after it;
* after the object: the exit code the object stands for (0 exactly when ``"ok": true``), never 130.

Standard library only, and small: the console script imports it before rich or the command line.
"""

from __future__ import annotations

import json
import os
import sys

TYPE_CHECKING = False  # typing loads only for type checkers: this is on the command line's start-up path
if TYPE_CHECKING:
    from typing import Any

JSON_SCHEMA = 1
INTERRUPTED_EXIT = 130  # Ctrl-C's code in a shell; SIGTERM and SIGHUP alike (one code: "interrupted")
JSON = False  # --json is on the command line: every exit prints one object
# What a --json command has committed so far (apply-patch, revert: "engines"): the fields of the object a
# signal prints before the command's own (None: no command running, only the bare interrupted object).
INTERRUPTED: dict[str, Any] | None = None
decided: int | None = None  # the exit code, fixed once the object (or its first byte) is out
_writing = False
_pending = False  # a signal came while the object was being written


def begin(json_on: bool) -> None:
    """A command starts (``toolkit.cli.main``): nothing decided, nothing written."""
    global JSON, INTERRUPTED, decided, _writing, _pending
    JSON, INTERRUPTED, decided, _writing, _pending = json_on, ({} if json_on else None), None, False, False


def json_text(ok: bool, fields: dict[str, Any]) -> str:
    return json.dumps({"schema": JSON_SCHEMA, "ok": ok, **fields}, indent=2) + "\n"


def write_object(ok: bool, fields: dict[str, Any], code: int | None = None, stream: Any = None) -> None:
    """Write the one JSON object to ``stream`` (stdout) and fix the exit code it stands for (``code``;
    default 0 if ``ok`` else 1). A signal meanwhile waits for the last byte. A write that fails (a closed
    pipe, a full disk) decides nothing: the caller's error handling does."""
    global _writing, decided, INTERRUPTED
    code = (0 if ok else 1) if code is None else code
    if ok != (code == 0):
        raise ValueError(f'exit code {code} with "ok": {ok}')
    text = json_text(ok, fields)
    INTERRUPTED = None  # one object per run: a signal from here on prints no second one
    stream = sys.stdout if stream is None else stream
    if stream is None:  # started with stdout closed
        import errno

        raise BrokenPipeError(errno.EPIPE, "stdout is closed")
    _writing = True
    try:
        stream.write(text)
        stream.flush()
    except BaseException:
        _writing = False
        if _pending:  # nothing whole was written: the signal ends it, with no object
            _end(report=False)
        raise
    decided = code
    _writing = False
    if _pending:
        _end()


def interrupted_fields() -> dict[str, Any]:
    fields = INTERRUPTED or {}
    committed = " (the engines listed were committed whole; nothing else was written)" if "engines" in fields else ""
    return {"error": f"interrupted{committed}", "kind": "interrupted", "interrupted": True, **fields}


def on_signal(signum: int, frame: object) -> None:
    """The handler of SIGINT, SIGTERM and SIGHUP for the whole command line (but ``verify``'s Ctrl-C)."""
    global _pending
    if _writing:
        _pending = True
        return
    _end()


def _end(report: bool = True) -> None:
    """End the process now, with the one outcome: the decided code, or interrupted (130)."""
    if decided is not None:
        flush()
        os._exit(decided)
    if report and JSON:
        try:
            write_object(False, interrupted_fields(), INTERRUPTED_EXIT)
        except BaseException:  # stdout gone: the exit code still says it
            pass
    flush()
    try:
        if sys.stdout is not None and sys.stdout.isatty():
            sys.stdout.write("\x1b[?25h")  # a spinner may have hidden the cursor
            sys.stdout.flush()
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
    os._exit(INTERRUPTED_EXIT)


def flush() -> None:
    for stream in (sys.stdout, sys.stderr):  # what the command printed is out before an abrupt end
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # a closed pipe or stream: nothing more to say there
            pass
