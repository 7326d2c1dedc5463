"""``python -m toolkit`` and the ``toolkit`` console script (``toolkit.__main__:run``).

Kept light on purpose: a Ctrl-C while rich and the command line load, or a reader that closes the pipe
(``toolkit status --json | head -1``), ends in one word or in silence, never in a traceback.

Ctrl-C ends a command at once ("interrupted", exit 130) instead of raising ``KeyboardInterrupt``
wherever Python happens to be: raised inside an import or a weakref callback, that exception is only
reported ("Exception ignored in ...") and the command goes on. Nothing is lost by ending at once: the
patch engine holds signals while it writes (``toolkit.engine.interrupts``), puts every file back, then hands
the signal on to this handler. ``verify`` and ``own-tests`` keep ``KeyboardInterrupt`` until they are done,
so that verify stops the server it started and own-tests removes its private copies.
"""

from __future__ import annotations

import sys

# Commands that clean up after themselves on Ctrl-C: verify stops the server it started, own-tests removes its
# private copies of the engine; each ends with one word and 130 too (toolkit.cli.main).
KEEPS_CTRL_C = ("verify", "own-tests")


def run() -> None:
    """Run the command line and exit with its code: 130 on Ctrl-C, 141 when stdout closes early."""
    command = next((arg for arg in sys.argv[1:] if not arg.startswith("-")), "")
    if command not in KEEPS_CTRL_C:
        _ctrl_c_ends_at_once()
    elif command == "own-tests":
        _termination_unwinds()
    try:
        from toolkit.cli import main

        code = main()
        if sys.stdout is not None:  # (None: started with stdout closed, and -q)
            sys.stdout.flush()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        code = 130
    except BrokenPipeError:  # Python's documented recipe: no flush error at exit either
        from toolkit.cli.output import silence_stdout

        silence_stdout()
        code = 141
    except OSError as exc:  # the last flush of what argparse printed (--help > /dev/full)
        from toolkit.cli.output import StdoutError, silence_stdout

        silence_stdout()
        sys.stderr.write(f"toolkit: {StdoutError(exc)}\n")
        code = 1
    finally:  # also after argparse's own exits (--help, --version, a usage error), and for verify
        _ctrl_c_ends_at_once()
    sys.exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):  # what the command printed is out before an abrupt end
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # a closed pipe or stream: nothing more to say there
            pass


def _stop(signum: int, frame: object) -> None:
    import os

    output = sys.modules.get("toolkit.cli.output")  # loaded: a command is running, maybe with --json
    if output is not None and getattr(output, "INTERRUPTED", None) is not None:
        try:  # the one JSON object even now: "interrupted": true and what was committed before
            output.emit_interrupted()
        except BaseException:
            pass
    _flush()
    try:
        if sys.stdout.isatty():
            sys.stdout.write("\x1b[?25h")  # a spinner may have hidden the cursor
            sys.stdout.flush()
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
    except (OSError, ValueError, AttributeError):
        pass
    os._exit(130)


def _raise_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _termination_unwinds() -> None:
    """SIGTERM and SIGHUP unwind like Ctrl-C from the first instant (own-tests: its copies go, exit 130)."""
    import _signal  # type: ignore[import-not-found]

    for signum in (_signal.SIGTERM, _signal.SIGHUP):
        if _signal.getsignal(signum) == _signal.SIG_DFL:
            _signal.signal(signum, _raise_interrupt)


def _ctrl_c_ends_at_once() -> None:
    """From now on Ctrl-C ends the process with 130 and one word (unless SIGINT is ignored)."""
    # the C module: ``signal`` builds its enums in Python first, time a Ctrl-C can land in (no stubs exist;
    # mypy reports the missing module once, at _termination_unwinds' import above)
    import _signal

    _flush()
    try:
        if _signal.getsignal(_signal.SIGINT) in (_signal.default_int_handler, _stop):
            _signal.signal(_signal.SIGINT, _stop)
    except ValueError:  # not the main thread
        pass


if __name__ == "__main__":
    run()
