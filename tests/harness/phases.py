"""Time spent per test folder, for ``scripts/test.sh``'s closing table (so CI time can be watched).

A pytest plugin: it adds up setup, call and teardown of every test under its folder (two levels below
``tests/``, e.g. ``tests/patches/vllm``), prints the table in the terminal summary and, when
``TOOLKIT_PHASES_FILE`` names a file, appends one ``seconds<TAB>phase`` line per folder to it. When
``TOOLKIT_DURATIONS_FILE`` names a file, every setup, call or teardown of a second or more is appended
to it as it ends (``seconds<TAB>when<TAB>nodeid``): where CI's time goes, readable while it runs.
"""

from __future__ import annotations

import os
from collections import defaultdict

_SECONDS: dict[str, float] = defaultdict(float)


def _folder(nodeid: str) -> str:
    parts = nodeid.split("::")[0].split("/")[:-1]  # drop the file name
    return "/".join(parts[:3]) or "tests"


def pytest_runtest_logreport(report) -> None:
    _SECONDS[_folder(report.nodeid)] += report.duration
    path = os.environ.get("TOOLKIT_DURATIONS_FILE")
    if path and report.duration >= 1.0 and not os.environ.get("PYTEST_XDIST_WORKER"):  # xdist: the controller  # each slow step as it ends, so a run still going can be read
        with open(path, "a") as handle:
            handle.write(f"{report.duration:.1f}\t{report.when}\t{report.nodeid}\n")


def pytest_terminal_summary(terminalreporter) -> None:
    if not _SECONDS:
        return
    terminalreporter.section("time per test folder")
    for folder, seconds in sorted(_SECONDS.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:8.1f}s  {folder}")
    path = os.environ.get("TOOLKIT_PHASES_FILE")
    if path and not os.environ.get("PYTEST_XDIST_WORKER"):  # xdist: the controller's totals, once
        with open(path, "a") as handle:
            for folder, seconds in sorted(_SECONDS.items()):
                handle.write(f"{seconds:.1f}\tpytest {folder}\n")
