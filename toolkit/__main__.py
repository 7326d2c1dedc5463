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
    sys.exit(code)


if __name__ == "__main__":
    run()
