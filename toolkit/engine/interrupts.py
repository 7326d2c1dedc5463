"""Hold Ctrl-C (and SIGTERM, SIGHUP) while the patch engine writes, so that a signal can never land
between "file replaced" and "recorded as replaced".

Inside :func:`held`, a signal is only noted. The writer calls :meth:`Held.check` at the points where
stopping is safe (before the commit): it raises :class:`Interrupted`, the writer puts every file back,
and on leaving the block the signal is delivered again with its own handler (Ctrl-C becomes
``KeyboardInterrupt``, SIGTERM's default ends the process). A signal that arrives after the commit is
delivered once the write is whole, or, inside :func:`deferred`, once the caller has recorded what was
committed (the CLI's ``--json`` then reports it). Signals can be handled only in the main thread:
elsewhere nothing is held (no signal can interrupt such a thread either).
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


class _Deferral(Held):
    """A :func:`deferred` block: the handlers to put back when it ends."""

    def __init__(self) -> None:
        super().__init__()
        self.previous: dict[int, object] = {}


_DEFERRALS: list[_Deferral] = []


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Once a :func:`held` block inside this one has committed, signals stay held until this block
    ends: the caller records what was committed first (``--json`` on Ctrl-C reports it), then the
    signal is delivered. Before any commit, signals behave as without this block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    deferral = _Deferral()
    _DEFERRALS.append(deferral)
    try:
        yield
    finally:
        _DEFERRALS.remove(deferral)
        for signum, handler in deferral.previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        for signum in dict.fromkeys(deferral.pending):
            signal.raise_signal(signum)


@contextlib.contextmanager
def held() -> Iterator[Held]:
    holder = Held()
    if threading.current_thread() is not threading.main_thread():
        yield holder
        return
    previous = {}
    completed = False
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
            completed = True
    finally:
        deferral = _DEFERRALS[-1] if completed and _DEFERRALS else None
        for signum, handler in previous.items():
            if deferral is None:
                signal.signal(signum, handler)
            else:  # committed inside a deferred() block: signals stay held until it ends and delivers them
                deferral.previous.setdefault(signum, handler)
                signal.signal(signum, deferral.note)
        if deferral is not None:
            deferral.pending.extend(holder.pending)
        else:
            for pending in dict.fromkeys(holder.pending):
                signal.raise_signal(pending)  # with its own handler again: KeyboardInterrupt, or the default
    if stopped is not None:  # the program's own handler chose not to stop it: still say what happened
        raise PatchError(f"{stopped}; every file was put back as it was, nothing changed") from None
