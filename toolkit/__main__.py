"""``python -m toolkit`` and the ``toolkit`` console script (``toolkit.__main__:run``).

Kept light on purpose: a signal while rich and the command line load, or a reader that closes the pipe
(``toolkit status --json | head -1``), ends in one word (or, with ``--json``, one object) or in silence,
never in a traceback.

Ctrl-C, SIGTERM and SIGHUP end a command at once ("interrupted", exit 130) instead of raising
``KeyboardInterrupt`` wherever Python happens to be: raised inside an import or a weakref callback, that
exception is only reported ("Exception ignored in ...") and the command goes on. The handler
(``toolkit.base.outcome.on_signal``) is installed before anything heavy is imported, so that from the
first line of toolkit's code every exit is one outcome: under ``--json`` one object on stdout whose
``"ok"`` is true exactly when the exit code is 0. Nothing is lost by ending at once: the patch engine holds
signals while it writes (``toolkit.engine.interrupts``), puts every file back, then hands the signal on to
this handler. ``verify`` and ``own-tests`` keep ``KeyboardInterrupt`` (SIGTERM and SIGHUP raise it too) until
they are done, so that verify stops the server it started and own-tests removes its private copies.
"""

from __future__ import annotations

import sys

# the C module: ``signal`` builds its enums in Python first, time a signal can land in (no stubs exist)
import _signal  # type: ignore[import-not-found]

from toolkit.base import outcome


# Commands that clean up after themselves on a signal (each then ends with one word and 130 too).
KEEPS_CTRL_C = ("verify", "own-tests")


def run() -> None:
    """Run the command line and exit with its code: 130 on a signal, 141 when stdout closes early."""
    argv = sys.argv[1:]
    keeps = next((arg for arg in argv if not arg.startswith("-")), "") in KEEPS_CTRL_C
    outcome.JSON = "--json" in argv  # main() says it again once the arguments are parsed
    _signals_end_at_once(keeps)
    try:
        from toolkit.cli import main

        code = main()
        if sys.stdout is not None:  # (None: started with stdout closed, and -q)
            sys.stdout.flush()
    except KeyboardInterrupt:  # verify's or own-tests', once it has cleaned up (main() reports it)
        sys.stderr.write("interrupted\n")
        code = outcome.INTERRUPTED_EXIT
    except BrokenPipeError:  # Python's documented recipe: no flush error at exit either
        from toolkit.cli.output import silence_stdout

        silence_stdout()
        code = 141
    except OSError as exc:  # the last flush of what argparse printed (--help > /dev/full)
        from toolkit.cli.output import StdoutError, silence_stdout

        silence_stdout()
        sys.stderr.write(f"toolkit: {StdoutError(exc)}\n")
        code = 1
    except SystemExit as exc:  # argparse's own exits (--help, --version, a usage error)
        if isinstance(exc.code, str):
            sys.stderr.write(exc.code + "\n")
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:  # verify and own-tests too, from here on
        _signals_end_at_once(False)
    if outcome.decided is not None:  # the object written says what the exit is: nothing changes it now
        code = outcome.decided
        # Python's shutdown gives the signals their default action back (a Ctrl-C there died by SIGINT
        # after "ok": true): blocked from here, one that comes is dropped with the process
        if hasattr(_signal, "pthread_sigmask"):
            _signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGINT, _signal.SIGTERM, _signal.SIGHUP})
    sys.exit(code)


def _signals_end_at_once(keeps: bool) -> None:
    """From now on SIGINT, SIGTERM and SIGHUP end the process with one outcome (unless ignored or set by
    the embedding program); with ``keeps`` (verify, own-tests) they raise ``KeyboardInterrupt`` instead."""
    outcome.flush()
    ours = (_signal.default_int_handler, outcome.on_signal)
    try:
        for signum, stock in ((_signal.SIGINT, _signal.default_int_handler), (_signal.SIGTERM, _signal.SIG_DFL),
                              (_signal.SIGHUP, _signal.SIG_DFL)):
            current = _signal.getsignal(signum)
            if current is stock or current in ours:
                _signal.signal(signum, _signal.default_int_handler if keeps else outcome.on_signal)
    except ValueError:  # not the main thread
        pass


if __name__ == "__main__":
    run()
