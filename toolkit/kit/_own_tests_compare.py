"""``toolkit own-tests``: the per-test outcomes of a pytest junit-xml report, the comparison of a release run
with a patched run (flaky tests told from regressions by a rerun), and why a test fails on both (no engine,
no network)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import Iterable

from toolkit.kit._own_tests_select import NO_SERVER

PASSED, FAILED, ERROR, SKIPPED = "passed", "failed", "error", "skipped"
_RANK = {PASSED: 0, SKIPPED: 1, FAILED: 2, ERROR: 3}  # a test reported twice (teardown error) keeps the worst


@dataclass(frozen=True)
class Outcome:
    outcome: str
    reason: str = ""  # the first line of the failure, error or skip message
    detail: str = field(default="", compare=False)  # the message's start, to tell why (reason_group)
    # the traceback (junit's element text), searched only for the hub repository a download wanted: its
    # frames name CUDA, triton, ... in paths, so it never decides the group itself
    trace: str = field(default="", compare=False, repr=False)


def node_id(file: str, classname: str, name: str) -> str:
    """pytest's node id from a junit (xunit1) testcase: ``tests/a/test_b.py::TestC::test_d[x]``."""
    module = file[:-3].replace("/", ".") if file.endswith(".py") else ""
    inner = classname[len(module) + 1:] if module and classname.startswith(module + ".") else ""
    return "::".join([file, *[part for part in inner.split(".") if part], name]) if file else f"{classname}::{name}"


def parse_junit(xml_text: str) -> dict[str, Outcome]:
    """Per-test outcomes of a pytest ``--junitxml`` report written with ``-o junit_family=xunit1``."""
    outcomes: dict[str, Outcome] = {}
    for case in ET.fromstring(xml_text).iter("testcase"):
        file = case.get("file") or ""
        test = node_id(file, case.get("classname") or "", case.get("name") or "")
        outcome, reason, detail, trace = PASSED, "", "", ""
        for tag, kind in (("error", ERROR), ("failure", FAILED), ("skipped", SKIPPED)):
            element = case.find(tag)
            if element is not None:
                outcome = kind
                message = element.get("message") or element.text or ""
                reason, detail, trace = first_line(message), message[:2000], (element.text or "")[:100_000]
                break
        previous = outcomes.get(test)
        if previous is None or _RANK[outcome] > _RANK[previous.outcome]:
            outcomes[test] = Outcome(outcome, reason, detail, trace)
    return outcomes


def first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")[:300]


# Why a test fails on the release itself, by its message (first match wins).
REASON_GROUPS = (
    ("engine server (not started)", re.compile(re.escape(NO_SERVER))),
    ("hub download", re.compile(r"huggingface|hf_hub|HF_HUB_OFFLINE|LocalEntryNotFound|offline mode|couldn't connect"
                                r"|outgoing traffic has been disabled|is not a local folder and is not a valid model"
                                r"|Repository Not Found|OSError: Can't load"
                                r"|Invalid repository ID or local directory", re.I)),
    ("CUDA", re.compile(r"cuda|nvidia|nccl|Torch not compiled with|triton|GPU", re.I)),
    # SGLang's vendored tests predate the release (tests/upstream/sglang-*/PINNED.json): their mock tokenizer
    # managers lack what 0.5.23's serving layer reads (config_value, the published config namespaces)
    ("test older than the release", re.compile(r"has no attribute 'config_value'|config namespace '\w+' not published")),
    ("missing module", re.compile(r"ModuleNotFoundError|No module named|ImportError", re.I)),
    ("timeout", re.compile(r"Timeout", re.I)),
    ("network", re.compile(r"ConnectionError|Connection refused|Name or service not known|urlopen error", re.I)),
)


def reason_group(reason: str) -> str:
    return next((name for name, pattern in REASON_GROUPS if pattern.search(reason)), "other")


@dataclass
class Comparison:
    release_passed: set[str]
    patched_passed: set[str]
    regressions: list[str]  # passed on the release, failed patched (on the rerun too, when rerun)
    fixed: list[str]  # failed on the release, passed patched
    flaky: dict[str, str]  # differed once, the rerun disagreed with the first run: how
    failing_both: dict[str, Outcome]  # failed or errored on both (the release's reason)
    skipped_both: dict[str, Outcome]
    only_in_one: list[str]  # collected in one run only


def compare(release: dict[str, Outcome], patched: dict[str, Outcome],
            rerun_release: dict[str, Outcome] | None = None,
            rerun_patched: dict[str, Outcome] | None = None) -> Comparison:
    """Release vs patched, per test. A test whose outcome differs was rerun on both (``rerun_*``, None:
    not rerun): it counts as a regression only when the rerun agrees (release passes, patched does not);
    a rerun that disagrees with the first run makes it flaky, reported and not counted."""
    rel_pass = {t for t, o in release.items() if o.outcome == PASSED}
    pat_pass = {t for t, o in patched.items() if o.outcome == PASSED}
    regressions, fixed, flaky = [], [], {}
    for test in sorted(rel_pass - pat_pass):  # missing from the patched run (its file no longer imports) counts too
        again_rel = (rerun_release or {}).get(test)
        again_pat = (rerun_patched or {}).get(test)
        if rerun_release is None:
            regressions.append(test)
        elif again_rel is None or again_pat is None:
            regressions.append(test)  # the rerun did not report it: the first runs stand
        elif again_rel.outcome != PASSED:
            flaky[test] = f"passed on the release, then {again_rel.outcome} on the release's rerun"
        elif again_pat.outcome == PASSED:
            flaky[test] = f"{patched[test].outcome} patched, then passed on the patched rerun"
        else:
            regressions.append(test)
    for test in sorted(pat_pass - rel_pass):
        if test not in release:
            continue
        again_rel = (rerun_release or {}).get(test)
        if again_rel is not None and again_rel.outcome == PASSED:
            flaky[test] = f"{release[test].outcome} on the release, then passed on the release's rerun"
        else:
            fixed.append(test)
    bad = (FAILED, ERROR)
    failing = {t: o for t, o in release.items() if o.outcome in bad and t in patched and patched[t].outcome in bad}
    skipped = {t: o for t, o in release.items() if o.outcome == SKIPPED and t in patched
               and patched[t].outcome == SKIPPED}
    return Comparison(rel_pass, pat_pass, regressions, fixed, flaky, failing, skipped,
                      sorted(set(release) ^ set(patched)))


# The repository a hub download wanted, as huggingface_hub and transformers name it in their errors.
HUB_REPO = re.compile(r"(?:\brepo_id\s*[:=]\s*'?|\bpath_or_repo_id\s*=\s*'|local directory specified: '"
                      r"|huggingface\.co/api/models/)([\w.-]+/[\w.-]+|[\w.-]+)")


def failure_group(text: str, trace: str = "") -> str:
    """``reason_group`` of ``text``, with the repository named for a hub download (what would have to be
    provided), found in ``text`` or else in the traceback ``trace``."""
    group = reason_group(text)
    repo = (HUB_REPO.search(text) or HUB_REPO.search(trace)) if group == "hub download" else None
    return f"{group} ({repo.group(1)})" if repo else group


def grouped(failing: dict[str, Outcome]) -> dict[str, list[tuple[str, str]]]:
    """Tests failing on both runs by why: group -> [(test, first line of the release's reason)]."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for test, outcome in sorted(failing.items()):
        groups.setdefault(failure_group(f"{outcome.reason}\n{outcome.detail}", outcome.trace), []).append((test, outcome.reason))
    return dict(sorted(groups.items(), key=lambda item: (-len(item[1]), item[0])))


def skipped_list(release: str, failing_both: dict[str, list[dict[str, str]]], under: Iterable[str] = ()) -> str:
    """The generated list of the engine's own tests that fail on the release and patched alike (never
    counted against the patches), in markdown: one section per reason group, one line per test with the
    release run's reason. ``failing_both`` is the report's (group -> [{"test", "reason"}])."""
    total = sum(len(tests) for tests in failing_both.values())
    scope = f" below {', '.join(under)}" if under else ""
    lines = [f"# {release}: the engine's own tests that fail on the release and patched alike{scope}", "",
             f"Generated by `toolkit own-tests {release}"
             + "".join(f" --under {u}" for u in under) + " --skipped-list FILE`; do not edit by hand. "
             f"{total} tests, grouped by why; each fails on the release itself, so none is counted against "
             "the patches.", ""]
    for group, tests in failing_both.items():
        lines += [f"## {group} ({len(tests)})", ""]
        lines += [f"- `{item['test']}`: {item['reason'].replace('|', '/')}" for item in tests]
        lines.append("")
    if not failing_both:
        lines += ["None.", ""]
    return "\n".join(lines)


