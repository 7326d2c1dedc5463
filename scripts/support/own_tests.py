"""The pure parts of scripts/engine_own_tests.py (no engine, no network): which of an engine's own test
files exercise the modules our patches edit, the per-test outcomes of a pytest junit-xml report, and
the comparison of a release run with a patched run. tests/scripts_own_tests checks them without a venv."""

from __future__ import annotations

import ast
import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

# Upstream test files that start a real engine server (vLLM's `vllm serve` wrappers in tests/utils.py,
# SGLang's `popen_launch_server` in sglang.test.test_utils, which the sglang wheel ships): run, but with
# the server refused (SERVER_PLUGIN) unless asked, so their unit tests count and their server tests are
# named as not run (each server costs a minute of CPU and, offline, fails on the hub download anyway).
SERVER_MARKERS = ("RemoteOpenAIServer", "RemoteVLLMServer", "popen_launch_server")
# module -> the names in it that start a server (a class: its __init__ refused; a function: replaced)
SERVER_STARTERS = (("tests.utils", ("RemoteOpenAIServer", "RemoteVLLMServer")),
                   ("sglang.test.test_utils", ("popen_launch_server",)))
NO_SERVER = "engine server not started (engine_own_tests.py --with-servers starts them)"
SERVER_PLUGIN = f"""
import importlib

import pytest

def _refuse(*args, **kwargs):
    raise RuntimeError({NO_SERVER!r})

@pytest.hookimpl(tryfirst=True)
def pytest_collection(session):
    # before the test modules import them, so a `from ... import popen_launch_server` binds the refusal
    for module_name, names in {SERVER_STARTERS!r}:
        try:
            module = importlib.import_module(module_name)
        except Exception:
            continue
        for name in names:
            starter = getattr(module, name, None)
            if isinstance(starter, type):
                starter.__init__ = _refuse
            elif starter is not None:
                setattr(module, name, _refuse)
"""

# vLLM's tests/conftest.py cleans up after every test (cleanup_fixture -> cleanup_dist_env_and_memory): the
# distributed state, then gc.collect() and the accelerator's caches. On these CPUs the collection alone takes
# about a second a test (hours over the chosen files); this keeps the distributed part, the only state a
# CPU test leaves, on the release and patched runs alike.
CPU_CLEANUP_PLUGIN = """
def pytest_plugin_registered(plugin, manager):
    if getattr(plugin, "__name__", "").rpartition(".")[2] != "conftest" \\
            or not callable(getattr(plugin, "cleanup_dist_env_and_memory", None)):
        return
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    def cleanup_dist_env(shutdown_ray=False):
        destroy_model_parallel()
        destroy_distributed_environment()
        if shutdown_ray:
            import ray
            ray.shutdown()

    plugin.cleanup_dist_env_and_memory = cleanup_dist_env
"""

PASSED, FAILED, ERROR, SKIPPED = "passed", "failed", "error", "skipped"
_RANK = {PASSED: 0, SKIPPED: 1, FAILED: 2, ERROR: 3}  # a test reported twice (teardown error) keeps the worst


def module_of(package: str, relpath: str) -> str:
    """``vllm`` + ``v1/core/kv_cache_utils.py`` -> ``vllm.v1.core.kv_cache_utils`` (``__init__.py``: the package)."""
    parts = [package, *Path(relpath).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def public_names(source: str) -> set[str]:
    """The names a module defines at top level (functions, classes, assignments), not ``_private`` ones."""
    names: set[str] = set()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if isinstance(target, ast.Name):
                    names.add(target.id)
    return {name for name in names if not name.startswith("_")}


@dataclass(frozen=True)
class Target:
    """A module one of our patches edits, with what its parent packages re-export of it: a test that
    writes ``from vllm.entrypoints.openai.chat_completion import X`` exercises the module defining X."""

    module: str
    names: frozenset[str] = frozenset()
    # parent package -> the module's public names that parent's __init__.py mentions (re-exports)
    reexports: tuple[tuple[str, frozenset[str]], ...] = ()


def make_target(package_root: Path, package: str, relpath: str) -> Target:
    """The target for ``relpath`` of the engine package at ``package_root`` (the release's files)."""
    module = module_of(package, relpath)
    path = package_root / relpath
    names = frozenset(public_names(path.read_text(encoding="utf-8"))) if path.is_file() else frozenset()
    reexports = []
    parts = Path(relpath).with_suffix("").parts[:-1]
    for depth in range(len(parts), -1, -1):
        init = package_root.joinpath(*parts[:depth], "__init__.py")
        if not init.is_file():
            continue
        text = init.read_text(encoding="utf-8")
        exported = frozenset(name for name in names if re.search(rf"\b{re.escape(name)}\b", text))
        if exported:
            reexports.append((".".join([package, *parts[:depth]]), exported))
    return Target(module, names, tuple(reexports))


def exercised_modules(source: str, targets: Iterable[Target]) -> set[str]:
    """The target modules a test file imports (the module, a submodule, the module from its parent, or a
    name its parent re-exports) or names in a string (``mock.patch("vllm.v1.core.kv_cache_utils.f")``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    hits: set[str] = set()
    targets = list(targets)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                hits |= {t.module for t in targets if _within(alias.name, t.module)}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported = {alias.name for alias in node.names}
            for t in targets:
                if _within(node.module, t.module):
                    hits.add(t.module)
                elif t.module.startswith(node.module + "."):
                    reexported = dict(t.reexports).get(node.module, frozenset())
                    if t.module[len(node.module) + 1:] in imported or imported & reexported:
                        hits.add(t.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            hits |= {t.module for t in targets if _within(node.value.split(":")[0], t.module)}
    return hits


def _within(name: str, module: str) -> bool:
    return name == module or name.startswith(module + ".")


@dataclass
class Selection:
    """The test files chosen: file -> target modules it exercises; and notes on some of them (servers refused)."""

    files: dict[str, list[str]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def select_test_files(tests_root: Path, targets: list[Target], under: list[str] = (),
                      with_servers: bool = False, tests_dir: str = "tests") -> Selection:
    """Every ``test_*.py`` below ``tests_root/tests_dir`` (vLLM's sdist: ``tests``, SGLang's sources:
    ``test``) that exercises a target, restricted to the paths starting with one of ``under`` (relative
    to ``tests_root``) when given."""
    chosen = Selection()
    for path in sorted((tests_root / tests_dir).rglob("test_*.py")):
        rel = path.relative_to(tests_root).as_posix()
        if under and not any(rel.startswith(prefix.rstrip("/") + ("/" if not prefix.endswith(".py") else ""))
                             or rel == prefix for prefix in under):
            continue
        source = path.read_text(encoding="utf-8", errors="replace")
        hits = exercised_modules(source, targets)
        if not hits:
            continue
        chosen.files[rel] = sorted(hits)
        if not with_servers and any(marker in source for marker in SERVER_MARKERS):
            chosen.notes[rel] = "its server tests run with the server refused (--with-servers starts it)"
    return chosen


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
             f"Generated by `scripts/engine_own_tests.py {release}"
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


def nearest(selection: Selection, package: str, tests_dir: str = "tests") -> Selection:
    """Of ``selection``, the files nearest the edited code: below the test folder that mirrors the package
    of a module the file exercises (vLLM lays its tests out like its sources: ``vllm/v1/core/kv_cache_utils.py``
    is tested in ``tests/v1/core/``), or named for that module (``test_kv_cache_utils.py``). The others import
    an edited module for a type or a helper (a KV connector's tests import ``KVCacheBlock``); there are
    thousands of them, hours on a CPU: ``--scope all`` runs them too."""
    near = Selection()
    for file, modules in selection.files.items():
        for module in modules:
            parts = module.split(".")[1:] if module.startswith(package + ".") else []
            if not parts:
                continue
            folder = "/".join([tests_dir, *parts[:-1]]) + "/"
            if file.startswith(folder) or Path(file).name == f"test_{parts[-1]}.py":
                near.files[file] = modules
                break
    near.notes = {file: note for file, note in selection.notes.items() if file in near.files}
    return near
