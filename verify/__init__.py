"""`toolkit verify`: launch a real engine server and prove the patched engine right.

Use from Python or pytest::

    from verify import verify, run_checks, CHECKS
    report = verify("path/to/model", engine="vllm")
    assert report.ok, report.results

The names load on first use: importing the package needs no optional extra (the checks need the
``verify`` extra, and say so in one sentence when it is missing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from verify.checks import CHECKS, Check, CheckResult, Target, run_checks
    from verify.run import VerifyReport, verify

__all__ = ["verify", "VerifyReport", "run_checks", "CHECKS", "Check", "CheckResult", "Target"]

_LAZY = {"verify": "verify.run", "VerifyReport": "verify.run", "run_checks": "verify.checks",
         "CHECKS": "verify.checks", "Check": "verify.checks", "CheckResult": "verify.checks",
         "Target": "verify.checks"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'verify' has no attribute {name!r}")
