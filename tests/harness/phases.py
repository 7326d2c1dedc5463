"""Time spent per test folder, for ``scripts/test.sh``'s closing table (so CI time can be watched).

A pytest plugin: it adds up setup, call and teardown of every test under its folder (two levels below
``tests/``, e.g. ``tests/patches/vllm``), wall seconds and CPU seconds, prints the table in the
terminal summary and, when ``TOOLKIT_PHASES_FILE`` names a file, appends one ``seconds<TAB>phase``
line per folder to it (``pytest FOLDER`` for the wall time, ``pytest FOLDER (cpu)`` for the CPU time).
When ``TOOLKIT_DURATIONS_FILE`` names a file, every setup, call or teardown of a second or more is
appended to it as it ends (``seconds<TAB>when<TAB>nodeid<TAB>cpu seconds``): where CI's time goes, readable
while it runs; on a machine whose cores are all busy, the CPU column is what a test costs the others.

CPU seconds are the test process's own user + system time plus that of its children once they have
ended and been waited for (``os.times``): engine servers and drivers, which do most of the work, count
when the test that started them stops them. A process still running (a session's server) counts at
the teardown that stops it. Under xdist each worker measures its own tests and the number rides to the
controller on the report (``user_properties``).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict

import pytest

from tests.harness.workers import RECORDED_NAME, read_unit_seconds, schedule_unit

_SECONDS: dict[str, float] = defaultdict(float)
_CPU: dict[str, float] = defaultdict(float)
_UNIT_SECONDS: dict[str, float] = {}  # per scheduling unit (tests/harness/workers.py)
_DESELECTED: list[int] = []  # tests left out (a plain run sees it here): units ran in part, nothing is recorded


def pytest_deselected(items) -> None:
    if items:
        _DESELECTED.append(len(items))


def ran_in_part(config, exitstatus: int) -> bool:
    """Whether some unit of this run may have run only in part, so that its seconds say too little: tests
    deselected (-k, -m, --deselect, --quick; under xdist the workers deselect, so the controller reads the
    options), or the run stopped early (-x, Ctrl-C, an internal error)."""
    option = config.option
    if _DESELECTED or os.environ.get("TOOLKIT_QUICK") == "1":
        return True
    if getattr(option, "keyword", "") or getattr(option, "markexpr", "") or getattr(option, "deselect", None):
        return True
    if getattr(option, "maxfail", 0) or getattr(option, "lf", False) or getattr(option, "failedfirst", False):
        return True
    return exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED)


CPU_PROPERTY = "toolkit_cpu_seconds"
_CPU_KEY = pytest.StashKey[dict]()  # per test item: when -> CPU seconds of that phase


def _folder(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")[:-1]  # drop the file name
    return "/".join(parts[:3]) or "tests"


def _cpu_now() -> float:
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


def _measured(item, when: str):
    start = _cpu_now()
    try:
        yield
    finally:
        item.stash.setdefault(_CPU_KEY, {})[when] = _cpu_now() - start


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    yield from _measured(item, "setup")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    yield from _measured(item, "call")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    yield from _measured(item, "teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    seconds = item.stash.get(_CPU_KEY, {}).get(call.when)
    if seconds is not None:
        report.user_properties = [*report.user_properties, (CPU_PROPERTY, round(seconds, 3))]


def pytest_runtest_logreport(report) -> None:
    folder = _folder(report.nodeid)
    _SECONDS[folder] += report.duration
    unit = schedule_unit(report.nodeid)
    _UNIT_SECONDS[unit] = _UNIT_SECONDS.get(unit, 0.0) + report.duration
    cpu = None
    for name, value in getattr(report, "user_properties", ()) or ():
        if name == CPU_PROPERTY:
            cpu = float(value)
            _CPU[folder] += cpu
    path = os.environ.get("TOOLKIT_DURATIONS_FILE")
    if path and report.duration >= 1.0 and not os.environ.get("PYTEST_XDIST_WORKER"):  # xdist: the controller  # each slow step as it ends, so a run still going can be read
        with open(path, "a") as handle:
            handle.write(f"{report.duration:.1f}\t{report.when}\t{report.nodeid}\t{'' if cpu is None else f'{cpu:.1f}'}\n")


def pytest_terminal_summary(terminalreporter) -> None:
    if not _SECONDS:
        return
    terminalreporter.section("time per test folder (wall seconds, CPU seconds incl. finished children)")
    for folder, seconds in sorted(_SECONDS.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f}s wall {_CPU.get(folder, 0.0):8.1f}s cpu  {folder}")
    path = os.environ.get("TOOLKIT_PHASES_FILE")
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):  # xdist: the controller's totals, once
        with open(path, "a") as handle:
            for folder, seconds in sorted(_SECONDS.items()):
                handle.write(f"{seconds:.1f}\tpytest {folder}\n")
                handle.write(f"{_CPU.get(folder, 0.0):.1f}\tpytest {folder} (cpu)\n")


def pytest_sessionfinish(session, exitstatus) -> None:
    """The controller (or a plain run) adds this run's seconds per scheduling unit to the shared cache's
    record, which orders the next run's units longest first. Only units that ran are replaced; a run
    whose units may have run in part (``ran_in_part``) records nothing."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not _UNIT_SECONDS or ran_in_part(session.config, exitstatus):
        return
    from tests.harness.fixtures import toolkit_cache_dir
    from toolkit.engine.fs import atomic_write

    path = toolkit_cache_dir() / RECORDED_NAME
    table = {**read_unit_seconds(path), **{unit: round(seconds, 1) for unit, seconds in _UNIT_SECONDS.items()}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(table, indent=1, sort_keys=True).encode(), 0o644)
    except OSError:
        pass  # an ordering hint only: a read-only or full cache leaves the next run in xdist's order
