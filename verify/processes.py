"""A server's processes, found and signalled by PID (psutil): whether one is alive, a process tree
together with its process group, a signal that ignores a process already gone.

A process is named by (pid, create_time): a pid alone may be reused once its process is reaped.
Needs psutil (the `verify` extra; every engine already depends on it).
"""

from __future__ import annotations

import os

from toolkit.base.extras import require

require("verify", ("psutil",), "toolkit verify's server launcher")
import psutil  # noqa: E402

__all__ = ["pid_alive", "create_time", "group_members", "tree_and_group", "send_signal"]

_GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


def pid_alive(pid: int, started: float | None = None) -> bool:
    """True when ``pid`` runs (not a zombie) and, if given, is the process created at ``started``."""
    try:
        process = psutil.Process(pid)
        if process.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return False
        return started is None or process.create_time() == started
    except _GONE:
        return False


def create_time(pid: int) -> float | None:
    """When the process ``pid`` now names was created; None when there is none."""
    try:
        return psutil.Process(pid).create_time()
    except _GONE:
        return None


def group_members(pgid: int) -> dict[int, float]:
    """pid -> create_time of the live members of process group ``pgid``."""
    found = {}
    for process in psutil.process_iter(["status", "create_time"]):
        if process.info["status"] in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            continue
        try:
            if os.getpgid(process.pid) == pgid:
                found[process.pid] = process.info["create_time"]
        except OSError:
            pass
    return found


def tree_and_group(root: int | None, pgid: int | None) -> dict[int, float]:
    """pid -> create_time of ``root``, its descendants, and the members of process group ``pgid``."""
    found: dict[int, float] = {}
    if root is not None:
        try:
            process = psutil.Process(root)
            for member in (process, *process.children(recursive=True)):
                try:
                    found[member.pid] = member.create_time()
                except _GONE:
                    pass
        except _GONE:
            pass
    if pgid is not None:
        for pid, created in group_members(pgid).items():
            found.setdefault(pid, created)
    return found


def send_signal(pid: int, sig: int) -> None:
    """``sig`` to ``pid``; nothing when it is gone or not ours."""
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
