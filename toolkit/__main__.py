"""``python -m toolkit`` and the ``toolkit`` console script (``toolkit.__main__:run``).

Kept light on purpose: a Ctrl-C while rich and the command line load, or a reader that closes the pipe
(``toolkit status --json | head -1``), ends in one word or in silence, never in a traceback.
"""

from __future__ import annotations

import sys


def run() -> None:
    """Run the command line and exit with its code: 130 on Ctrl-C, 141 when stdout closes early."""
    try:
        from toolkit.cli import main

        code = main()
        sys.stdout.flush()
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        code = 130
    except BrokenPipeError:  # Python's documented recipe: no flush error at exit either
        from toolkit.cli_output import silence_stdout

        silence_stdout()
        code = 141
    finally:  # also after argparse's own exits (--help, --version, a usage error)
        _ctrl_c_ends_at_once()
    sys.exit(code)


def _ctrl_c_ends_at_once() -> None:
    """The command is done: a Ctrl-C while Python shuts down (threading's shutdown, atexit) would print
    "Exception ignored in ... KeyboardInterrupt". End at once instead, with Ctrl-C's exit code."""
    import os
    import signal

    def stop(signum: int, frame: object) -> None:
        os._exit(130)

    for stream in (sys.stdout, sys.stderr):  # what the command printed is out before any such end
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):  # a closed pipe or stream: nothing more to say there
            pass
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, stop)
    except ValueError:  # not the main thread
        pass


if __name__ == "__main__":
    run()
