"""`toolkit verify`: launch a real engine server and prove the patched engine right.

Use from Python or pytest::

    from verify import verify, run_checks, CHECKS
    report = verify("path/to/model", engine="vllm")
    assert report.ok, report.results
"""

from verify.checks import CHECKS, Check, CheckResult, Target, run_checks
from verify.run import VerifyReport, verify

__all__ = ["verify", "VerifyReport", "run_checks", "CHECKS", "Check", "CheckResult", "Target"]
