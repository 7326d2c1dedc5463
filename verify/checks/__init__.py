"""The checks behind `toolkit verify`, one module per kind: ``check_types`` (a check, its target and
result), ``core`` (the token-id contract), one module per patched feature (``multi_turn``, ``sweep_checks``,
``stream_checks``), and ``suite`` (every check in order, and running them).

``NAMES`` lists the checks without loading one (a check module needs the ``verify`` extra): the command
line builds its parser from it. The other names load on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolkit.base.lazy import lazy_attributes

if TYPE_CHECKING:
    from toolkit.verify.checks.check_types import (ERROR, FAIL, MESSAGES, PASS, SKIP, TOOLS, Check, CheckFailed, CheckResult,
                                                   CheckSkipped, Target)
    from toolkit.verify.checks.suite import CHECKS, all_checks, run_checks

# Every check's name, in the order they run; tests/verify/test_check_names.py keeps it equal to all_checks().
NAMES = ("nonstream-decode", "stream-decode", "stream-parity", "tools", "prompt-template", "input-ids",
         "concurrency", "multi-turn", "patch-sweep", "responses-stream")

__all__ = ["NAMES", "CHECKS", "all_checks", "run_checks", "Check", "CheckResult", "CheckFailed", "CheckSkipped",
           "Target", "PASS", "FAIL", "SKIP", "ERROR", "MESSAGES", "TOOLS"]

_BASE = ("ERROR", "FAIL", "MESSAGES", "PASS", "SKIP", "TOOLS", "Check", "CheckFailed", "CheckResult", "CheckSkipped",
         "Target")
_LAZY = {**{name: "toolkit.verify.checks.check_types" for name in _BASE},
         **{name: "toolkit.verify.checks.suite" for name in ("CHECKS", "all_checks", "run_checks")}}

__getattr__ = lazy_attributes(__name__, _LAZY, globals())
