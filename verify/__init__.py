"""`toolkit verify`: launch a real engine server and prove the patched engine right.

Use from Python or pytest::

    from toolkit.verify import verify, run_checks, CHECKS
    report = verify("path/to/model", engine="vllm")
    assert report.ok, report.results

The names load on first use: importing the package needs no optional extra (the checks need the
``verify`` extra, and say so in one sentence when it is missing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from toolkit.base.lazy import lazy_attributes

if TYPE_CHECKING:
    from toolkit.verify.checks.check_types import Check, CheckResult, Target
    from toolkit.verify.checks.suite import CHECKS, run_checks
    from toolkit.verify.run import VerifyReport, verify

__all__ = ["verify", "VerifyReport", "run_checks", "CHECKS", "Check", "CheckResult", "Target"]

_LAZY = {"verify": "toolkit.verify.run", "VerifyReport": "toolkit.verify.run", "run_checks": "toolkit.verify.checks.suite",
         "CHECKS": "toolkit.verify.checks.suite", "Check": "toolkit.verify.checks.check_types",
         "CheckResult": "toolkit.verify.checks.check_types", "Target": "toolkit.verify.checks.check_types"}


__getattr__ = lazy_attributes(__name__, _LAZY, globals())
