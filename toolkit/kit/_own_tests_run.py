"""``toolkit own-tests RELEASE [--patch ID]...``: the engine's own tests of the code the patches edit, on the
release and on the patched release (issue 50; a command since issue 58).

1. The files the patches edit on that release (``Patch.files_for(version)``, first-party and outside patches
   alike: the ``toolkit.patches`` entry points) become module names; the release's own test files that
   import one of them are chosen (:mod:`toolkit.kit._own_tests_select`), by default (``--scope near``) those
   in the test folder mirroring an edited module's package or named for it.
2. The tests: vLLM's from the release's sdist on the index, SGLang's from ``--tests DIR``
   (:mod:`toolkit.kit._own_tests_fetch`).
3. Two private copies of the installed engine (:mod:`toolkit.kit._own_tests_engine`), one patched, each run by
   the engine's interpreter with pytest, offline, with a private HF_HOME (a copy of ``--hf-home DIR``, or an
   empty one). The copies live in ``<cache>/scratch/own-tests-*`` and are removed on every exit, Ctrl-C,
   SIGTERM and SIGHUP included; the logs are kept in ``<cache>/engine-tests/logs/``.
4. A test that passes on the release and not patched is rerun on both: still so, a regression; otherwise
   flaky, reported and not counted (:mod:`toolkit.kit._own_tests_compare`).

``--release-from RECORD.json`` takes the release's outcomes from an earlier whole run's record
(:mod:`toolkit.kit._own_tests_record`, which keeps every test that did not pass on the release) instead of
running the release again: only the patched copy runs, and every test whose patched outcome differs from the
record is then run on the release *and* patched again, so a regression is still one seen on the release now.

Exit codes: 0 every release pass passes patched, 1 a regression, 2 usage or setup error, 3 nothing to
compare (no test file chosen, or none collected), 130 interrupted.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from toolkit.kit._declare import Patch
from toolkit.engine import interrupts
from toolkit.errors import PatchError, UsageError
from toolkit.kit import _own_tests_compare as compare
from toolkit.kit import _own_tests_record as record
from toolkit.kit import _own_tests_select as select
from toolkit.base import engines
from toolkit.kit._own_tests_engine import EngineInstall, PytestRun, locate, private_copy, toolkit_view
from toolkit.kit._own_tests_fetch import engine_tests_dir, fetch_tests, runner_site
from toolkit.patch_registry import Catalog, catalog as engine_catalog, ordered
from toolkit.kit._releases import cache_dir, parse_release

EXIT_REGRESSION = 1
EXIT_NOTHING_COMPARED = 3
SGLANG_TESTS_DIR = "test"  # SGLang's tests live in test/ (vLLM's sdist: tests/)


class NothingCompared(PatchError):
    """No test ran on the release, so nothing was compared: its own exit code (3), never a pass."""


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, unwound like Ctrl-C so that the private copies go."""


@dataclass
class Options:
    release: str  # DIST==VERSION
    patch_ids: Sequence[str] = ()
    extra_patches: Sequence[str] = ()  # FILE.py:NAME
    under: Sequence[str] = ()
    scope: str = "near"
    with_servers: bool = False
    rerun: bool = True
    timeout: int = 300
    python: str | None = None
    tests: Path | None = None
    hf_home: Path | None = None
    paths: Sequence[Path] = ()
    release_from: Path | None = None  # a record whose release outcomes stand for the release run
    say: Callable[[str], None] = field(default=lambda line: None)


def release_of(text: str) -> tuple[str, str]:
    dist, version = parse_release(text)
    if dist not in engines.DISTRIBUTIONS:
        raise UsageError(f"unknown engine distribution {dist!r}: expected {', '.join(engines.DISTRIBUTIONS)}")
    return dist, version


def load_extra_patch(spec: str) -> Patch:
    """``FILE.py:NAME``: a Patch object defined in a file outside the registry (the test of the test)."""
    path, _, name = spec.rpartition(":")
    module_spec = importlib.util.spec_from_file_location(f"_own_tests_extra_{Path(path).stem}", path) if path else None
    if module_spec is None or module_spec.loader is None:
        raise UsageError(f"--extra-patch wants FILE.py:NAME, not {spec!r}")
    try:
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        patch = getattr(module, name)
    except Exception as exc:
        raise UsageError(f"--extra-patch {spec}: {type(exc).__name__}: {exc}") from None
    if not isinstance(patch, Patch):
        raise UsageError(f"--extra-patch {spec}: {name} is a {type(patch).__name__}, not a toolkit.declare.Patch")
    return patch


@dataclass(frozen=True)
class Chosen:
    engine: str
    registered: list[Patch]  # the registered patches run (TOOLKIT_EXPECT_PATCHES)
    patches: list[Patch]  # and those of --extra-patch
    catalog: Catalog
    relpaths: list[str]


def choose(dist: str, version: str, options: Options) -> Chosen:
    engine = engines.DISTRIBUTIONS[dist].name
    known = list(engine_catalog(engine).patches)
    unknown = sorted(set(options.patch_ids) - {p.id for p in known})
    if unknown:
        raise UsageError(f"unknown patch for {engine}: {', '.join(unknown)} (toolkit list {engine} shows them)")
    extra = [load_extra_patch(spec) for spec in options.extra_patches]
    registered = [p for p in known if (p.id in options.patch_ids if options.patch_ids else p.supports(version))]
    patches = [*registered, *extra]
    if not patches:
        raise UsageError(f"no patch supports {dist} {version}")
    relpaths = sorted({edit.relpath for p in patches for edit in p.files_for(version)})
    return Chosen(engine, registered, patches, Catalog(engine, ordered([*known, *extra])), relpaths)


def tests_root(dist: str, version: str, options: Options) -> tuple[Path, str]:
    """The folder the tests run from (pytest's rootdir) and the test folder in it."""
    if options.tests is None:
        return fetch_tests(dist, version), "tests"
    root = options.tests.expanduser().resolve()
    folder = SGLANG_TESTS_DIR if engines.DISTRIBUTIONS[dist].name == "sglang" else "tests"
    if not (root / folder).is_dir():
        raise UsageError(f"--tests {options.tests}: no {folder}/ folder in it (the release's tests, laid out as in "
                         "its repository)")
    return root, folder


def selection_of(root: Path, folder: str, chosen: Chosen, options: Options,
                 read: Path | Callable[[str], bytes | None]) -> select.Selection:
    targets = [select.make_target(read, chosen.engine, rel) for rel in chosen.relpaths]
    selection = select.select_test_files(root, targets, options.under, options.with_servers, folder)
    if options.scope == "near" and chosen.engine != "sglang":  # SGLang's given files are chosen near already
        selection = select.nearest(selection, chosen.engine, folder)
    return selection


def list_files(options: Options) -> select.Selection:
    """The test files a run would choose: from the release's files in the cache (``toolkit.releases``); no
    engine environment, no copy, no run."""
    from toolkit.kit._releases import release_tree

    dist, version = release_of(options.release)
    chosen = choose(dist, version, options)
    wanted = sorted({*chosen.relpaths, *(i for rel in chosen.relpaths for i in select.parent_inits(rel))})
    tree = release_tree(dist, version, wanted)
    root, folder = tests_root(dist, version, options)
    return selection_of(root, folder, chosen, options, tree.read)


def prepare(options: Options) -> None:
    """What a run fetches (the tests, pytest beside the engine), into the cache; nothing run, no copy."""
    dist, version = release_of(options.release)
    tests_root(dist, version, options)
    runner_site(locate(dist, version, options.python).python)


@contextlib.contextmanager
def _terminate_unwinds() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Terminated` while a run is on (main thread only): every ``finally`` runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: object) -> None:
        raise Terminated(signal.Signals(signum).name)

    previous = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)
                if signal.getsignal(s) not in (signal.SIG_IGN, None)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run(options: Options) -> dict[str, Any]:
    """One own-tests run: the report (``--json``'s fields)."""
    dist, version = release_of(options.release)
    chosen = choose(dist, version, options)
    recorded = None  # read before any copy is made: a record that cannot stand for the release is refused at once
    if options.release_from is not None:
        recorded = record.recorded_release(options.release_from, f"{dist}=={version}", [p.id for p in chosen.patches])
    started = time.monotonic()
    with _terminate_unwinds():
        root, folder = tests_root(dist, version, options)
        install = locate(dist, version, options.python)
        runner = runner_site(install.python)
        scratch = cache_dir() / "scratch"  # beside the cached venvs: one file system, so hard links work
        scratch.mkdir(parents=True, exist_ok=True)
        work = scratch / f"own-tests-{dist}-{version}-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            work.mkdir()
            report = _compare(dist, version, chosen, options, install, root, folder, runner, work, recorded)
        finally:
            with interrupts.held():  # a second Ctrl-C waits for the copies to go
                shutil.rmtree(work, ignore_errors=True)
    return {**report, "seconds": round(time.monotonic() - started, 1)}


def _compare(dist: str, version: str, chosen: Chosen, options: Options, install: EngineInstall, root: Path, folder: str,
             runner: Path, work: Path, recorded: dict[str, Any] | None) -> dict[str, Any]:
    release_root = private_copy(install, work / "release")
    selection = selection_of(root, folder, chosen, options, release_root / chosen.engine)
    if not selection.files:
        raise NothingCompared("no test file of the release exercises the edited modules"
                              + (f" below {', '.join(options.under)}" if options.under else "")
                              + ": nothing to compare")
    patched_root = private_copy(install, work / "patched", chosen.patches, chosen.catalog)
    logs_parent = engine_tests_dir() / "logs"
    logs_parent.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.mkdtemp(prefix=f"{dist}-{version}-", dir=str(logs_parent)))  # kept
    home = work / "hf-home"
    if options.hf_home is not None:
        shutil.copytree(options.hf_home, home)
    else:
        home.mkdir()
    hub = {"HF_HOME": str(home), **({"TIKTOKEN_ENCODINGS_BASE": str(home / "tiktoken")}
                                    if (home / "tiktoken").is_dir() else {})}
    pytest_run = PytestRun(install, root, runner, toolkit_view(work), hub, options.timeout, options.with_servers,
                           tuple(options.paths))
    files = list(selection.files)
    expect = ",".join(p.id for p in chosen.registered)  # an --extra-patch is not registered: not expected

    def collected(outcomes: dict[str, compare.Outcome], log: Path) -> dict[str, compare.Outcome]:
        if not outcomes:
            raise NothingCompared(f"pytest collected no test of the {len(files)} files chosen (its output: {log}): "
                                  "nothing to compare")
        return outcomes

    if recorded is not None:
        options.say(f"{len(files)} test files; the release's outcomes from {options.release_from} (recorded "
                    f"{recorded['date']}); the patched run ...")
        patched = collected(pytest_run.run(patched_root, files, logs / "patched.log", expect=expect),
                            logs / "patched.log")
        release = record.release_outcomes(recorded, patched)
    else:
        options.say(f"{len(files)} test files; the release run ...")
        release = collected(pytest_run.run(release_root, files, logs / "release.log"), logs / "release.log")
        options.say(f"{len(release)} tests; the patched run ...")
        patched = pytest_run.run(patched_root, files, logs / "patched.log", expect=expect)
    rerun_release = rerun_patched = None
    differing = sorted(t for t in set(release) & set(patched)
                       if (release[t].outcome == compare.PASSED) != (patched[t].outcome == compare.PASSED))
    if differing and options.rerun:
        options.say(f"{len(differing)} tests differ; rerunning them on both ...")
        rerun_release = pytest_run.run(release_root, differing, logs / "rerun-release.log")
        rerun_patched = pytest_run.run(patched_root, differing, logs / "rerun-patched.log", expect=expect)
    result = compare.compare(release, patched, rerun_release, rerun_patched)
    return {
        "release": f"{dist}=={version}", "patches": [p.id for p in chosen.patches], "edited_files": chosen.relpaths,
        "test_files": selection.files, "notes": selection.notes, "tests": len(release),
        "release_passed": len(result.release_passed), "patched_passed": len(result.patched_passed),
        "regressions": result.regressions, "fixed": result.fixed, "flaky": result.flaky,
        "failing_both": {group: [{"test": t, "reason": r} for t, r in tests]
                         for group, tests in compare.grouped(result.failing_both).items()},
        "skipped_both": len(result.skipped_both), "only_in_one_run": result.only_in_one, "logs": str(logs),
        "failures": {t: patched[t].reason if t in patched else "not collected patched" for t in result.regressions},
        # the release run's tests that did not pass (what a record keeps, so that a later run can stand on it)
        "release_not_passed": {} if recorded is not None else
        {t: o.outcome for t, o in sorted(release.items()) if o.outcome != compare.PASSED},
        "release_from": None if recorded is None else {"record": str(options.release_from), "date": recorded["date"],
                                                        "run_on_the_release_now": sorted(rerun_release or {})},
    }
