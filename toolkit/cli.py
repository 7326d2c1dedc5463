"""``toolkit`` command line: list, apply-patch, revert, status, check, verify. ``--json`` everywhere.

Exit codes: 0 ok, 1 failure, 2 usage error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from typing import Any, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from toolkit.version import __version__
from toolkit import engine as _engine
from toolkit.api import ids_for, resolve_engines
from toolkit.discovery import InstalledEngine
from toolkit.errors import DriftError, PatchError, UsageError, io_error
from toolkit.patches import RegistryError
from toolkit.sources import load_source

STATE_STYLE = {"applied": "green", "not applied": "dim", "partial": "yellow", "drifted": "red",
               "in progress": "cyan", "patched, no manifest": "red", "runtime missing": "red"}


class _Parser(argparse.ArgumentParser):
    json_errors = False  # set by main() when --json is on the command line: errors go to stdout as JSON

    def error(self, message: str) -> None:  # one sentence and what to do next, exit 2
        sentence = f"{message} (see `toolkit {self.prog.split()[-1]} --help`)"
        if _Parser.json_errors:
            print(json.dumps({"ok": False, "error": sentence, "kind": "usage"}, indent=2))
            self.exit(2)
        self.print_usage(sys.stderr)
        self.exit(2, f"toolkit: error: {sentence}\n")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (0 <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"seconds must be a finite number >= 0, not {text}")
    return value


def _add_common(parser: argparse.ArgumentParser, *, engine: bool = True, python: bool = True) -> None:
    if engine:
        parser.add_argument("engine", nargs="?", choices=("vllm", "sglang"), help="engine (default: every installed one)")
    if python:
        parser.add_argument("--python", metavar="PATH", help="the engine's interpreter (default: this one)")
    parser.add_argument("--json", action="store_true", help="print JSON for machines")


def _add_write_options(p: argparse.ArgumentParser, edited_by: str) -> None:
    """The options apply-patch and revert share."""
    _add_common(p)
    p.add_argument("--patch", action="append", dest="patches", metavar="ID", help="only this patch (repeatable)")
    p.add_argument("--force", action="store_true",
                   help=f"also overwrite files changed since they were patched (only those {edited_by})")
    p.add_argument("--dry-run", action="store_true", help="write nothing")
    p.add_argument("--diff", action="store_true", help="show unified diffs")
    p.add_argument("--lock-timeout", type=_seconds, default=_engine.DEFAULT_LOCK_TIMEOUT, metavar="S")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="toolkit", description="Patch installed vLLM and SGLang engines with versioned codemods.")
    parser.add_argument("--version", action="version", version=f"toolkit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("list", help="list the patches this toolkit ships")
    _add_common(p, python=False)

    p = sub.add_parser("apply-patch", help="apply patches to an installed engine")
    _add_write_options(p, "the patches edit")
    p.add_argument("--allow-unknown-version", action="store_true", help="try an engine version outside a patch's specifier")

    p = sub.add_parser("revert", help="restore the engine's original files byte-for-byte")
    _add_write_options(p, "the reverted patches edit")

    p = sub.add_parser("status", help="which patches are applied, per engine")
    _add_common(p)

    p = sub.add_parser("repair", help="put the engine's release files back (checked against pip's RECORD), clear the state")
    _add_common(p)
    p.add_argument("--lock-timeout", type=_seconds, default=_engine.DEFAULT_LOCK_TIMEOUT, metavar="S")

    p = sub.add_parser("verify", help="launch a real server and check the token-id contract")
    p.add_argument("--model", required=True, metavar="PATH_OR_NAME")
    p.add_argument("--engine", choices=("vllm", "sglang"), help="default: the one installed")
    p.add_argument("--python", metavar="PATH", help="the engine's interpreter (default: this one)")
    p.add_argument("--server-arg", action="append", dest="server_args", default=[], metavar="ARG",
                   help="extra server argument, repeatable; write --server-arg=--flag for flags")
    p.add_argument("--url", help="verify an already-running server instead of launching one")
    p.add_argument("--checks", help="comma-separated check names (default: all)")
    p.add_argument("--timeout", type=float, default=300.0, metavar="S", help="server start-up limit")
    p.add_argument("--json", action="store_true", help="print JSON for machines")

    p = sub.add_parser("check", help="would each patch apply to a source tree or wheel (porting tool)")
    p.add_argument("--source", required=True, metavar="PATH", help="a .whl file or an unpacked tree")
    p.add_argument("--patch", action="append", dest="patches", metavar="ID")
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    return parser


def _engine_json(installed: InstalledEngine) -> dict[str, Any]:
    return {
        "engine": installed.engine,
        "distribution": installed.distribution,
        "version": installed.version,
        "package_dir": installed.package_dir,
    }


def _engines(args: argparse.Namespace) -> list[InstalledEngine]:
    engines = resolve_engines(args.engine, getattr(args, "patches", None), args.python)
    if not engines:
        where = args.python or sys.executable
        what = args.engine or "vLLM or SGLang"
        raise UsageError(f"{what} is not installed for {where}; install it or pass --python PATH")
    return engines


def cmd_list(args: argparse.Namespace, console: Console) -> int:
    patches = [p for p in _engine.registry() if args.engine in (None, p.engine)]
    if args.json:
        print(json.dumps([{"id": p.id, "engine": p.engine, "versions": p.versions, "summary": p.summary,
                           "files": [f.relpath for f in p.files], "runtime_modules": list(p.runtime_modules)}
                          for p in patches], indent=2))
        return 0
    table = Table(title="toolkit patches")
    for column in ("patch", "engine", "versions", "files", "summary"):
        table.add_column(column)
    for p in patches:
        table.add_row(p.id, p.engine, p.versions_text, "\n".join(f.relpath for f in p.files), p.summary)
    console.print(table)
    return 0


def cmd_apply_or_revert(args: argparse.Namespace, console: Console) -> int:
    reverting = args.command == "revert"
    rows = []
    for installed in _engines(args):
        ids = ids_for(installed, args.patches)
        with console.status(f"{'reverting' if reverting else 'patching'} {installed.engine} {installed.version}...",
                            spinner="dots") if not args.json else _null():
            if reverting:
                result = _engine.revert(installed, ids, force=args.force, dry_run=args.dry_run, lock_timeout=args.lock_timeout)
            else:
                result = _engine.apply(installed, ids, force=args.force, dry_run=args.dry_run,
                                       allow_unknown_version=args.allow_unknown_version, lock_timeout=args.lock_timeout)
        rows.append((installed, result))
    if args.json:
        out = []
        for installed, result in rows:
            entry = {**_engine_json(installed), "applied_patches": result.patches, "changed_files": result.changed_files,
                     "dry_run": result.dry_run, "unchanged": not result.changed}
            if args.diff:
                entry["diff"] = result.diff()
            out.append(entry)
        print(json.dumps({"ok": True, "engines": out}, indent=2))
        return 0
    for installed, result in rows:
        name = f"{installed.distribution} {installed.version}"
        if args.diff and result.changed:
            console.print(result.diff(), markup=False, highlight=False, soft_wrap=True)
        verb = "would change" if result.dry_run else "changed"
        if not result.changed:
            if reverting:
                console.print(f"{name}: nothing to revert (applied: {', '.join(result.patches) or 'none'})")
            else:
                console.print(f"{name}: already applied ({', '.join(result.patches)})")
        else:
            console.print(f"{name}: {verb} {len(result.changed)} file(s); applied now: "
                          f"{', '.join(result.patches) or 'none'}")
            for relpath in result.changed_files:
                console.print(f"  {relpath}", markup=False)
    return 0


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    engines = resolve_engines(args.engine, None, args.python)
    if not engines and args.engine is None:
        # Nothing installed is a state to report, not a mistake: `toolkit status` answers it (exit 0).
        if args.json:
            print("[]")
        else:
            console.print(f"no vLLM or SGLang installed for {args.python or sys.executable}", markup=False,
                          highlight=False)
        return 0
    rows = [row for installed in engines or _engines(args) for row in _engine.status(installed)]
    if args.json:
        print(json.dumps([asdict(row) for row in rows], indent=2))
    else:
        table = Table(title="toolkit status")
        for column in ("engine", "version", "patch", "state", "detail"):
            table.add_column(column)
        for row in rows:
            supported = "" if row.supported else " (version not supported)"
            style = STATE_STYLE.get(row.state, "default")
            table.add_row(row.engine, f"{row.distribution} {row.engine_version}", row.patch_id,
                          f"[{style}]{escape(row.state)}[/{style}]", escape(row.detail + supported))
        console.print(table)
    return 0 if all(row.state in ("applied", "not applied", "in progress") for row in rows) else 1


def cmd_repair(args: argparse.Namespace, console: Console) -> int:
    from toolkit.api import repair_engines

    results = repair_engines(args.engine, args.python, lock_timeout=args.lock_timeout)
    if args.json:
        print(json.dumps({"ok": True, "engines": [asdict(r) for r in results]}, indent=2))
        return 0
    if not results:
        where = args.python or sys.executable
        console.print(f"nothing to repair: no {args.engine or 'vLLM or SGLang'} and no toolkit state for {where}",
                      markup=False, highlight=False)
    for r in results:
        if r.orphan:
            console.print(f"{r.engine}: not installed any more; removed its toolkit state", highlight=False)
            continue
        name = f"{r.distribution} {r.version}"
        if r.restored:
            origins = sorted(set(r.restored.values()))
            console.print(f"{name}: restored {len(r.restored)} file(s) to the release's bytes "
                          f"(from {' and '.join(origins)}); patch state cleared", highlight=False)
            for relpath, origin in sorted(r.restored.items()):
                console.print(f"  {relpath} ({origin})", markup=False, highlight=False)
        elif r.cleared_state:
            console.print(f"{name}: files match pip's RECORD; patch state cleared", highlight=False)
        else:
            console.print(f"{name}: files match pip's RECORD; nothing to repair", highlight=False)
        for relpath in r.unverifiable:
            console.print(f"  {relpath}: not in pip's RECORD, left as it is", markup=False, highlight=False)
    return 0


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    source = load_source(args.source)
    checks = _engine.check_source(source, args.patches)
    if args.json:
        print(json.dumps({
            "source": str(source.origin), "engine": source.engine, "distribution": source.distribution,
            "version": source.version, "ok": all(c.ok for c in checks),
            "patches": [{"patch": c.patch_id, "supported_version": c.supported, "ok": c.ok, "errors": c.errors,
                         "anchors": [asdict(a) for a in c.anchors]} for c in checks],
        }, indent=2))
    else:
        table = Table(title=escape(f"{source.distribution} {source.version}: {source.origin}"))
        for column in ("patch", "file", "anchor", "result"):
            table.add_column(column)
        for check in checks:
            for anchor in check.anchors:
                result = "[green]found[/green]" if anchor.ok else f"[red]{escape(anchor.problem)}[/red]"
                table.add_row(check.patch_id, escape(anchor.relpath), escape(f"{anchor.anchor}: {anchor.description}"), result)
            for error in check.errors:
                table.add_row(check.patch_id, "", "", f"[red]{escape(error)}[/red]")
        console.print(table)
        for check in checks:
            verdict = "[green]would apply[/green]" if check.ok else "[red]would NOT apply[/red]"
            note = "" if check.supported else " (version outside its specifier: needs --allow-unknown-version)"
            console.print(f"{check.patch_id}: {verdict}{note}")
    return 0 if all(c.ok for c in checks) else 1


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    from toolkit.verify.checks import all_checks
    from toolkit.verify.run import verify

    names = [n.strip() for n in args.checks.split(",") if n.strip()] if args.checks else None
    known = {c.name for c in all_checks()}
    if names and not set(names) <= known:
        raise UsageError(f"unknown check(s): {', '.join(sorted(set(names) - known))} (known: {', '.join(sorted(known))})")
    status_line = None if args.json else console.status("verify: preparing", spinner="dots")
    if status_line:
        status_line.start()

    def phase(message: str) -> None:
        if status_line:
            status_line.update(f"verify: {message}")

    def result(row) -> None:
        if status_line:
            console.print(f"  {row.name}: {row.status}", highlight=False)

    try:
        report = verify(args.model, engine=args.engine, python=args.python, server_args=args.server_args,
                        url=args.url, checks=names, timeout=args.timeout, on_phase=phase, on_result=result)
    finally:
        if status_line:
            status_line.stop()
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
        return 0 if report.ok else 1
    table = Table(title=f"toolkit verify: {report.engine} {report.engine_version}, {report.model}")
    for column in ("check", "result", "detail"):
        table.add_column(column)
    style = {"pass": "green", "fail": "red", "error": "red", "skip": "dim"}
    for row in report.results:
        table.add_row(row.name, f"[{style[row.status]}]{row.status}[/{style[row.status]}]", row.detail)
    console.print(table)
    for row in report.results:
        if row.evidence:
            console.print(f"[red]{row.name}[/red] evidence:", highlight=False)
            for key, value in row.evidence.items():
                console.print(f"  {key}: {value}", markup=False, highlight=False)
    if report.apply_first:
        console.print(f"[yellow]apply these patches first:[/yellow] toolkit apply-patch {report.engine} "
                      + " ".join(f"--patch {p}" for p in report.apply_first), highlight=False)
    if report.error:
        console.print(f"[red]{report.error}[/red]", highlight=False)
    if report.log_tail:
        console.print("server log (last lines):", highlight=False)
        console.print(report.log_tail, markup=False, highlight=False)
    timing = f" in {report.seconds:.0f}s" + (f" (start-up {report.startup_seconds:.0f}s)" if report.launched else "")
    colour = "green" if report.ok else "red"
    console.print(f"verdict: [{colour}]{report.verdict}[/{colour}] ({len(report.ran)} checks ran){timing}",
                  highlight=False)
    return 0 if report.ok else 1


COMMANDS = {"verify": cmd_verify, "list": cmd_list, "apply-patch": cmd_apply_or_revert, "revert": cmd_apply_or_revert,
            "status": cmd_status, "check": cmd_check, "repair": cmd_repair}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _Parser.json_errors = "--json" in argv
    args = build_parser().parse_args(argv)
    console = Console(stderr=False)
    errors = Console(stderr=True)
    try:
        return COMMANDS[args.command](args, console)
    except UsageError as exc:
        _report(args, errors, exc, "usage")
        return 2
    except PatchError as exc:
        _report(args, errors, exc, "drift" if isinstance(exc, DriftError) else "error")
        return 1
    except RegistryError as exc:  # another installed package's patch entry point: not our bug, theirs to fix
        _report(args, errors, exc, "error")
        return 1
    except KeyboardInterrupt:
        errors.print("interrupted")
        return 130
    except OSError as exc:  # a file-system error outside the patch engine's own handling
        _report(args, errors, io_error(exc, "cannot access"), "error")
        return 1
    except Exception as exc:  # a bug: still one sentence, the traceback only on request
        if os.environ.get("TOOLKIT_DEBUG"):
            raise
        _report(args, errors, PatchError(f"internal error ({type(exc).__name__}: {exc}); please report it, "
                                         "TOOLKIT_DEBUG=1 shows the traceback"), "internal")
        return 1


def _report(args: argparse.Namespace, errors: Console, exc: Exception, kind: str) -> None:
    if getattr(args, "json", False):
        payload: dict[str, Any] = {"ok": False, "error": str(exc), "kind": kind}
        if isinstance(exc, DriftError):
            payload["files"] = exc.files
        print(json.dumps(payload, indent=2))
    else:
        errors.print(f"[red]toolkit: {escape(str(exc))}[/red]", highlight=False, soft_wrap=True)


if __name__ == "__main__":
    sys.exit(main())
