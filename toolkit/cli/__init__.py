"""``toolkit`` command line: list, apply-patch, revert, status, repair, check, verify, matrix, new-patch, audit, own-tests. ``--json``,
``-q`` and ``-v`` everywhere; what each command prints is in :mod:`toolkit.cli.output`. apply-patch, revert and
status take ``--ray [ADDRESS]``: the same on every node of a Ray cluster (:mod:`toolkit.ray`).

Exit codes: 0 ok, 1 failure, 2 usage error, 130 interrupted, 141 stdout closed early (a pipe); own-tests also
3 (nothing to compare).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from dataclasses import asdict
from typing import Any, Sequence

from rich.console import Console

from toolkit import api, patch_registry
from toolkit.base import outcome
from toolkit.base.engines import titles
from toolkit.api import apply_each, installed_engines, revert_each, status_each
from toolkit.cli import output as out
from toolkit.cli import audit as audit_cli  # toolkit audit: its arguments and its command
from toolkit.cli import own_tests
from toolkit.cli.parser import _Parser, build_parser
from toolkit.cli.cluster_options import cmd_on_cluster
from toolkit.engine.check import check_source
from toolkit.engine.discovery import InstalledEngine, interpreter
from toolkit.engine.sources import load_source
from toolkit.errors import DriftError, PatchError, UsageError, io_error
from toolkit.patch_registry import select
from toolkit.cli import new_patch

PYTHON_OPTION = "--python PATH"
DEBUG_ON = ("1", "true", "yes", "on")


def cmd_list(args: argparse.Namespace, console: Console) -> int:
    patches = [p for p in select(args.engine).known if args.engine in (None, p.engine)]
    plugins = [p for p in patch_registry.plugins() if args.engine in (None, p.engine)]
    if args.json:
        out.emit_json(True, patches=[{"id": p.id, "engine": p.engine, "versions": p.versions, "summary": p.summary,
                                      "files": list(p.relpaths),  # on any release; file_edits: on which
                                      "file_edits": [{"relpath": f.relpath, "versions": f.versions} for f in p.files],
                                      "runtime_modules": list(p.runtime_modules), "after": list(p.after),
                                      "not_needed": {"versions": p.not_needed[0], "why": p.not_needed[1]}
                                      if p.not_needed[0] else None} for p in patches],
                      plugins=[asdict(p) for p in plugins])
        return 0
    out.print_list(console, patches, args.verbose)
    out.print_plugins(console, plugins, args.verbose)
    return 0


def _on_cluster(args: argparse.Namespace, console: Console) -> int | None:
    """With ``--ray``, the command on every node of the cluster (its exit code); else None (this machine)."""
    if args.ray is not None:
        return cmd_on_cluster(args, console)
    if args.node_timeout is not None:
        raise UsageError("--node-timeout goes with --ray")
    return None


def cmd_apply_or_revert(args: argparse.Namespace, console: Console) -> int:
    if (code := _on_cluster(args, console)) is not None:
        return code
    reverting = args.command == "revert"
    quiet = args.json or args.quiet

    def spinner(installed: InstalledEngine) -> Any:
        if quiet:
            return contextlib.nullcontext()
        verb = "reverting" if reverting else "patching"
        return console.status(f"{verb} {installed.engine} {installed.version}...", spinner="dots")

    selection = select(args.engine, args.patches)
    options = dict(force=args.force, dry_run=args.dry_run, lock_timeout=args.lock_timeout,
                   python_option=PYTHON_OPTION, around=spinner, on_result=out.record_committed(args.diff))
    if reverting:
        results = revert_each(selection, args.python, **options)
    else:
        results = apply_each(selection, args.python, allow_unknown_version=args.allow_unknown_version,
                             allow_editable=args.allow_editable, **options)
    rows = [(result.engine, result, result.skipped) for result in results]
    if args.json:
        out.emit_json(True, engines=[out.apply_json(result, args.diff) for result in results])
        return 0
    out.print_apply(console, rows, reverting=reverting, diff=args.diff, verbose=args.verbose)
    return 0


def cmd_status(args: argparse.Namespace, console: Console) -> int:
    if (code := _on_cluster(args, console)) is not None:
        return code
    selection = select(args.engine)
    per_engine = status_each(selection, args.python)
    if not per_engine and args.engine is None:
        # Nothing installed is a state to report, not a mistake: `toolkit status` answers it (exit 0).
        if args.json:
            out.emit_json(True, patches=[])
        else:
            console.print(f"no {titles()} installed for {args.python or sys.executable}", markup=False,
                          highlight=False)
        return 0
    if not per_engine:
        installed_engines(selection, args.python, python_option=PYTHON_OPTION)  # none: the usage error
    engines = [installed for installed, _ in per_engine]
    rows = [row for _, engine_rows in per_engine for row in engine_rows]
    declared = {(p.engine, p.id): p for p in selection.known}
    notes = {}
    for row in rows:
        patch = declared.get((row.engine, row.patch_id))
        if patch is not None and not row.supported and row.state == "not applied":
            why = patch.not_needed_on(row.engine_version)
            if why:
                notes[(row.engine, row.patch_id)] = why
    code = 0 if all(row.state in ("applied", "not applied", "in progress") for row in rows) else 1
    if args.json:
        out.emit_json(code == 0, patches=[{**asdict(row), "not_needed": notes.get((row.engine, row.patch_id), "")}
                                          for row in rows])
    else:
        out.print_status(console, rows, notes, args.verbose)
        if args.verbose:
            for installed in engines:
                console.print(f"{installed.engine}: {installed.package_dir} (python {installed.python})",
                              markup=False, highlight=False)
    return code


def cmd_repair(args: argparse.Namespace, console: Console) -> int:
    from toolkit.api import repair_engines

    results = repair_engines(args.engine, args.python, lock_timeout=args.lock_timeout)
    if args.json:
        out.emit_json(True, engines=[asdict(r) for r in results])
        return 0
    where = args.python or sys.executable
    nothing = f"nothing to repair: no {args.engine or titles()} and no toolkit state for {where}"
    out.print_repair(console, results, nothing, args.verbose)
    if args.verbose:
        for installed in api.installed_of({args.engine} if args.engine else None, args.python):  # those repaired
            console.print(f"{installed.engine}: {installed.package_dir} (python {installed.python})",
                          markup=False, highlight=False)
    return 0


def cmd_check(args: argparse.Namespace, console: Console) -> int:
    from toolkit.kit._releases import parse_release  # the DIST==VERSION of matrix --release, same words

    source = load_source(args.source, parse_release(args.release) if args.release else None)
    selection = select(source.engine, args.patches)  # the ids resolved once, against the tree's engine
    checks = check_source(source, selection.named(source.engine), catalog=selection.catalog(source.engine))
    ok = all(c.ok for c in checks)
    if args.json:
        out.emit_json(ok, **out.check_json(source, checks))
    else:
        out.print_check(console, source, checks, args.verbose)
    return 0 if ok else 1


def cmd_verify(args: argparse.Namespace, console: Console) -> int:
    from toolkit.verify.run import verify

    names = [n.strip() for n in args.checks.split(",") if n.strip()] if args.checks else None
    status_line = None if args.json or args.quiet else console.status("verify: preparing", spinner="dots")
    if status_line:
        status_line.start()

    def phase(message: str) -> None:
        if status_line:
            status_line.update(f"verify: {message}")

    def result(row: Any) -> None:
        if status_line:
            console.print(f"  {row.name}: {row.status}", highlight=False)

    try:
        report = verify(args.model, engine=args.engine, python=args.python, server_args=args.server_args,
                        url=args.url, checks=names, timeout=args.timeout, on_phase=phase, on_result=result)
    finally:
        if status_line:
            status_line.stop()
    if args.json:
        data = report.to_json()
        out.emit_json(bool(data.pop("ok")), **data)
    else:
        out.print_verify(console, report, args.verbose)
    return 0 if report.ok else 1


def cmd_matrix(args: argparse.Namespace, console: Console) -> int:
    from toolkit.kit import _matrix as matrix
    from toolkit.kit import _releases as releases

    selection = select(args.engine, args.patches)
    patches = list(selection.patches if selection.patches is not None else
                   [p for p in selection.known if p.engine in selection.engines()])
    engines = sorted({p.engine for p in patches})
    if args.releases:
        chosen = [releases.parse_release(spec) for spec in args.releases]
        foreign = [f"{d}=={v}" for d, v in chosen if releases.LINES[d][0] not in engines]
        if foreign:
            raise UsageError(f"no selected patch is for the engine of {', '.join(foreign)} "
                             f"(the patches selected are {'/'.join(engines) or 'none'}'s)")
    else:
        chosen = matrix.choose_releases(engines, index=args.index, offline=args.offline)
    status_line = None if args.json or args.quiet else console.status("matrix: reading the releases", spinner="dots")
    if status_line:
        status_line.start()
    try:
        cells = matrix.run(patches, chosen, offline=args.offline, known=selection.known, jobs=args.jobs,
                           progress=(lambda line: status_line.update(f"matrix: {line}")) if status_line else None)
    finally:
        if status_line:
            status_line.stop()
    problems = matrix.problems(cells)
    if args.json:
        out.emit_json(not problems, cells=[asdict(c) for c in cells], problems=problems)
    else:
        matrix.print_table(console, cells, args.verbose)
        for problem in problems:
            console.print(f"problem: {problem}", markup=False, highlight=False)
    return 1 if problems else 0


COMMANDS = {"verify": cmd_verify, "list": cmd_list, "apply-patch": cmd_apply_or_revert, "revert": cmd_apply_or_revert,
            "status": cmd_status, "check": cmd_check, "repair": cmd_repair,
            "matrix": cmd_matrix, "new-patch": new_patch.cmd_new_patch,
            "audit": audit_cli.cmd_audit, "own-tests": own_tests.cmd_own_tests}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _Parser.json_errors = "--json" in argv
    outcome.begin(_Parser.json_errors)  # nothing decided yet (in-process callers run main() again)
    args = build_parser().parse_args(argv)
    errors = Console(stderr=True)
    if out.stdout_closed() and (args.json or not args.quiet):  # `toolkit revert >&-`: refuse before acting
        out.say_stdout_closed("; nothing was done (-q runs it without output)")
        return 141
    console = out.stdout_console(args.quiet)
    outcome.begin(args.json)
    try:
        if getattr(args, "python", None) is not None and getattr(args, "ray", None) is None:
            # (with --ray each node reads the path on its own disk)
            args.python = interpreter(args.python)  # relative, or a venv's folder: an absolute bin/python
        return COMMANDS[args.command](args, console)
    except BrokenPipeError:  # `toolkit status --json | head -1`: the reader has all it wanted
        out.silence_stdout()
        return 141
    except UsageError as exc:
        out.report_error(args.json, errors, exc, "usage")
        return 2
    except PatchError as exc:  # a RegistryError too: another package's patch entry point, theirs to fix
        out.report_error(args.json, errors, exc, "drift" if isinstance(exc, DriftError) else "error")
        return 1
    except KeyboardInterrupt:  # verify's (every other command ends in toolkit.base.outcome.on_signal)
        if outcome.decided is not None:  # after its object: that object is the outcome
            return outcome.decided
        if not args.json:
            errors.print("interrupted")
        else:  # --json: still the one object, saying what was committed before the signal
            with contextlib.suppress(OSError, out.StdoutError):
                out.emit_interrupted()
        return outcome.INTERRUPTED_EXIT
    except out.StdoutError as exc:  # `--json > /dev/full`: the command ran, its report could not be written
        out.report_error(False, errors, exc, "error")
        return 1
    except OSError as exc:  # a file-system error outside the patch engine's own handling
        out.report_error(args.json, errors, io_error(exc, "cannot access"), "error")
        return 1
    except Exception as exc:  # a bug: still one sentence, the traceback only on request
        if os.environ.get("TOOLKIT_DEBUG", "").strip().lower() in DEBUG_ON:
            raise
        out.report_error(args.json, errors, PatchError(f"internal error ({type(exc).__name__}: {exc}); please "
                                                       "report it, TOOLKIT_DEBUG=1 shows the traceback"), "internal")
        return 1


if __name__ == "__main__":
    sys.exit(main())
