"""The checks `toolkit verify` runs, in the order it runs them, and running them on a target.

The verifier owns every check, the core ones and those of a patch's feature (``multi_turn``,
``sweep_checks``, ``stream_checks``): each names, per engine, the patch id it needs, and is skipped
when the target lacks it. Which patches a target has is the caller's to say (``Target.applied_patches``,
read from the install by ``toolkit.engine.patching.applied_ids``): nothing here imports or loads a patch.
"""

from __future__ import annotations

from typing import Callable, Sequence, cast

from toolkit.errors import UsageError
from toolkit.verify.checks import multi_turn, stream_checks, sweep_checks
from toolkit.verify.checks.check_types import ERROR, FAIL, PASS, SKIP, Check, CheckFailed, CheckResult, CheckSkipped, Target
from toolkit.verify.checks.core import CORE
from toolkit.verify.client import ServerGone

CHECKS: list[Check] = [*CORE, *multi_turn.CHECKS, *sweep_checks.CHECKS, *stream_checks.CHECKS]


def all_checks() -> list[Check]:
    """Every check, in the order they run."""
    return list(CHECKS)


def patch_skip(check: Check, target: Target) -> CheckResult | None:
    """``check``'s skip on ``target`` when the engine cannot run it or a patch it needs is not applied:
    known from the install alone, before any request. None when it can run."""
    missing = check.missing_patch(target)
    if missing == "":
        return CheckResult(check.name, SKIP, f"not available on {target.engine}")
    if missing:
        return CheckResult(check.name, SKIP, f"patch {missing} is not applied to {target.engine}")
    return None


def skips_before_serving(target: Target, names: list[str] | None = None,
                         checks: Sequence[Check] | None = None) -> list[CheckResult] | None:
    """When not one of ``names`` (default: all) of ``checks`` can run on ``target`` (``patch_skip``: only its
    ``engine`` and ``applied_patches`` are read, so an install will do), their skips; else None. A server
    started for such a run would answer nothing."""
    skips = [patch_skip(check, target) for check in select_checks(names, checks)]
    return cast("list[CheckResult]", skips) if all(skips) else None  # all(): not one is None


def select_checks(names: Sequence[str] | None, checks: Sequence[Check] | None = None) -> list[Check]:
    """The checks ``names`` (None or empty: every one) of ``checks`` (default: :func:`all_checks`), in the
    order they run: the one place a check name is resolved. An unknown name is a usage error (a
    ``ValueError`` too, as ``run_checks`` raised before)."""
    checks = all_checks() if checks is None else list(checks)
    known = [check.name for check in checks]
    unknown = sorted(set(names or ()) - set(known))
    if unknown:
        from toolkit.base.suggest import did_you_mean

        hint = did_you_mean(unknown[0], known) if len(unknown) == 1 else ""
        raise UnknownCheck(f"unknown check(s): {', '.join(unknown)} (known: {', '.join(sorted(known))}){hint}")
    return [check for check in checks if not names or check.name in names]


class UnknownCheck(UsageError, ValueError):
    """A check name that is none of the checks."""


def run_checks(target: Target, names: list[str] | None = None,
               on_result: Callable[[CheckResult], None] | None = None,
               checks: Sequence[Check] | None = None) -> list[CheckResult]:
    """Run ``names`` (default: all) of ``checks`` (default: :func:`all_checks`) against ``target``."""
    results = []
    for check in select_checks(names, checks):
        result = patch_skip(check, target)
        if result is None:
            try:
                result = CheckResult(check.name, PASS, check.run(target))
            except CheckSkipped as exc:
                result = CheckResult(check.name, SKIP, str(exc))
            except CheckFailed as exc:
                result = CheckResult(check.name, FAIL, exc.detail, exc.evidence)
            except ServerGone as exc:
                result = CheckResult(check.name, ERROR, f"the server stopped answering: {exc}")
            except AssertionError as exc:
                result = CheckResult(check.name, FAIL, str(exc))
        results.append(result)
        if on_result:
            on_result(result)
        if result.status == ERROR:
            break  # a dead server fails every later check the same way
    return results


# The checks whose missing patch makes the verdict "nothing verified"; the others are extras that a
# patch adds (input ids in, the Responses API) and are skipped, with the reason, without it.
CORE_CHECKS = ("nonstream-decode", "stream-decode", "stream-parity", "tools", "prompt-template", "concurrency")


def missing_patches(target: Target) -> list[str]:
    """Patches the target lacks that core checks need (for the "apply these first" message)."""
    return sorted({p for c in CORE if c.name in CORE_CHECKS for p in [c.missing_patch(target)] if p})
