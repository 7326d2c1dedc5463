"""``toolkit own-tests RELEASE --record FILE.json``: the record of the engines' own tests, release vs patched,
one entry per release, and the one generated list of the tests that fail on the release itself, written
beside it (``FILE-skipped.md``). This repository keeps its record in docs/engine-own-tests.json
(scripts/compat_matrix.py reads it for docs/compatibility.md)."""

from __future__ import annotations

import datetime
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from toolkit.errors import UsageError
from toolkit.kit._own_tests_compare import PASSED, Outcome

Report = dict[str, Any]


def skipped_path(record: Path) -> Path:
    """Where the generated list of ``record`` goes: ``engine-own-tests.json`` -> ``engine-own-tests-skipped.md``."""
    return record.with_name(f"{record.stem}-skipped.md")


def load(path: Path) -> Report:
    if not path.is_file():
        return {"schema": 1, "releases": {}}
    record: Report = json.loads(path.read_text(encoding="utf-8"))
    return record


def entry(report: Report) -> Report:
    """What the record keeps of one run's report (the ``--json`` object)."""
    return {
        "date": datetime.date.today().isoformat(), "patches": report["patches"],
        "test_files": len(report["test_files"]), "tests": report["tests"],
        "release_passed": report["release_passed"], "patched_passed": report["patched_passed"],
        "regressions": report["regressions"], "fixed": report["fixed"], "flaky": sorted(report["flaky"]),
        "not_run_servers": sorted(report["notes"]), "seconds": report["seconds"],
        "failing_both": report["failing_both"],
        "release_not_passed": report["release_not_passed"],
    }


def recorded_release(path: Path, release: str, patch_ids: list[str]) -> Report:
    """The entry of ``release`` in the record at ``path``, to stand for the release run (``--release-from``):
    it must exist, keep every test that did not pass on the release, and come from a run of the same patches."""
    try:
        item = load(path)["releases"].get(release)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--release-from {path}: cannot read it as a record: {exc}") from None
    if item is None:
        raise UsageError(f"--release-from {path}: no run of {release} in it (record one with --record)")
    if "release_not_passed" not in item:
        raise UsageError(f"--release-from {path}: its run of {release} ({item.get('date')}) predates the per-test "
                         "outcomes a record keeps now; record it again with --record")
    if sorted(item["patches"]) != sorted(patch_ids):
        raise UsageError(f"--release-from {path}: its run of {release} applied {', '.join(item['patches'])}, this one "
                         f"{', '.join(patch_ids)}; record a run of these patches, or run the release (no --release-from)")
    return item


def release_outcomes(item: Report, patched: dict[str, Outcome]) -> dict[str, Outcome]:
    """The release outcomes of the tests of a patched run, as the record ``item`` has them: a test it lists as not
    passing did so again (with the patched run's message where that one did not pass either, else the
    record's), any other test passed. A test that differs is then run on the release for real (the rerun)."""
    recorded_reasons = {entry["test"]: entry["reason"] for tests in item["failing_both"].values() for entry in tests}
    outcomes: dict[str, Outcome] = {}
    for test, now in patched.items():
        kind = item["release_not_passed"].get(test, PASSED)
        if kind == PASSED:
            outcomes[test] = Outcome(PASSED)
        elif now.outcome != PASSED:
            outcomes[test] = Outcome(kind, now.reason, now.detail, now.trace)
        else:
            outcomes[test] = Outcome(kind, recorded_reasons.get(test, f"{kind} on the release (recorded)"))
    return outcomes


def _write(path: Path, text: str) -> None:
    """All or nothing: a run stopped mid-write leaves the previous file."""
    fd, scratch = tempfile.mkstemp(prefix=f".{path.name}.", dir=str(path.parent))
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(scratch, 0o644)
        os.replace(scratch, path)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise


def update(report: Report, path: Path) -> None:
    """Put ``report``'s release in the record at ``path`` and rewrite the generated list beside it."""
    record = load(path)
    record["releases"][report["release"]] = entry(report)
    record["releases"] = dict(sorted(record["releases"].items()))
    _write(path, json.dumps(record, indent=1) + "\n")
    _write(skipped_path(path), skipped_markdown(record, path.name))


def verdict(item: Report) -> str:
    if item["regressions"]:
        return f"**{len(item['regressions'])} pass on the release only**"
    return "equal" + (f", {len(item['fixed'])} pass only patched" if item["fixed"] else "")


def failing_count(item: Report) -> int:
    return sum(len(tests) for tests in item["failing_both"].values())


def cell(record: Report, release: str) -> str:
    """The compatibility matrix's "own tests" cell of ``release`` (DIST==VERSION): ``—`` where not run."""
    item = record["releases"].get(release)
    if item is None:
        return "—"
    return f"{verdict(item)} ({item['patched_passed']}/{item['release_passed']})"


def table(record: Report) -> list[str]:
    lines = ["| release | test files | tests | pass on the release | pass patched | patched vs release "
             "| fail on the release too (why) | recorded |", "|---|---|---|---|---|---|---|---|"]
    for release, item in record["releases"].items():
        why = ", ".join(f"{len(tests)} {group}" for group, tests in item["failing_both"].items()) or "none"
        lines.append(f"| {release} | {item['test_files']} | {item['tests']} | {item['release_passed']} | "
                     f"{item['patched_passed']} | {verdict(item)} | {why} | {item['date']} |")
    return lines


def skipped_markdown(record: Report, name: str = "engine-own-tests.json") -> str:
    """The one generated list: every recorded test that fails on the release and patched alike, per release,
    grouped by why, with the release run's reason."""
    lines = ["# The engines' own tests that fail on the release itself", "",
             f"Generated by `toolkit own-tests RELEASE --record {name}` from {name}; do not "
             "edit by hand. Each test below fails on the release and on the patched release alike, so none is "
             "counted against the patches; the group says why (a hub download this offline machine cannot make, "
             "a CUDA-only path, a module the release's CPU install lacks, an engine server the run does not "
             "start).", ""]
    for release, item in record["releases"].items():
        lines += [f"## {release}: {failing_count(item)} of {item['tests']}", ""]
        for group, tests in item["failing_both"].items():
            lines += [f"### {release}: {group} ({len(tests)})", ""]
            lines += [f"- `{t['test']}`: {t['reason'].replace('|', '/')[:300]}" for t in tests]
            lines.append("")
        if not item["failing_both"]:
            lines += ["None.", ""]
    return "\n".join(lines)
