"""Hold Ctrl-C (and SIGTERM, SIGHUP) while the patch engine writes, so that a signal can never land
between "file replaced" and "recorded as replaced".

Inside :func:`held`, a signal is only noted. The writer calls :meth:`Held.check` at the points where
stopping is safe (before the commit): it raises :class:`Interrupted`, the writer puts every file back,
and on leaving the block the signal is delivered again with its own handler (Ctrl-C becomes
``KeyboardInterrupt``, SIGTERM's default ends the process). A signal that arrives after the commit is
delivered once the write is whole. Signals can be handled only in the main thread: elsewhere nothing
is held (no signal can interrupt such a thread either).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

from toolkit.errors import PatchError

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(BaseException):
    """A held signal, raised at a safe point so the writer rolls back; re-delivered on leaving."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum


class Held:
    def __init__(self) -> None:
        self.pending: list[int] = []

    def note(self, signum: int, frame: object) -> None:
        self.pending.append(signum)

    def check(self) -> None:
        """Raise :class:`Interrupted` if a signal arrived since the block began."""
        if self.pending:
            raise Interrupted(self.pending[0])


@contextlib.contextmanager
def held() -> Iterator[Held]:
    holder = Held()
    if threading.current_thread() is not threading.main_thread():
        yield holder
        return
    previous = {}
    try:
        for signum in SIGNALS:
            handler = signal.getsignal(signum)
            if handler is signal.SIG_IGN or handler is None:
                continue  # ignored (nohup, a background job) or set outside Python: leave it be
            previous[signum] = signal.signal(signum, holder.note)
        try:
            yield holder
        except Interrupted as exc:
            stopped: Interrupted | None = exc
        else:
            stopped = None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(holder.pending):
            signal.raise_signal(signum)  # with its own handler again: KeyboardInterrupt, or the default
    if stopped is not None:  # the program's own handler chose not to stop it: still say what happened
        raise PatchError(f"{stopped}; every file was put back as it was, nothing changed") from None
