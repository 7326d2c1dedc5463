"""``toolkit audit COPY UPSTREAM``: its arguments, and what it prints (the comparison is
:mod:`toolkit.kit._function_audit`). Exit 0 when the copy is current on every release asked, 1 when it is stale
(or the function is absent) on one, 2 for bad input."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from toolkit.cli import output as out
from toolkit.cli.options import add_output_options
from toolkit.errors import UsageError

EXAMPLE = ("toolkit audit src/prime_rl/inference/patches.py "
           "vllm.v1.core.sched.scheduler:Scheduler._update_from_kv_xfer_finished")


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("audit", help="compare a framework's copy of an engine function with every release of it",
                       description=f"e.g. {EXAMPLE}")
    p.add_argument("first", metavar="COPY",
                   help="the framework's copy: a .py file, FILE:QUALNAME or an importable module:qualname (with "
                        "--copy FILE, the one positional is UPSTREAM)")
    p.add_argument("upstream", nargs="?", metavar="UPSTREAM",
                   help="the engine's module:qualname it replaces, such as vllm.v1.core.sched.scheduler:Scheduler.step")
    p.add_argument("--copy", metavar="FILE", help="the file holding the copy (then only UPSTREAM is positional)")
    p.add_argument("--copy-qualname", metavar="QUALNAME",
                   help="the copy's qualified name in its file, e.g. patch_fn._update (default: the one function "
                        "named like UPSTREAM's)")
    p.add_argument("--release", action="append", dest="releases", metavar="DIST==VERSION",
                   help="only this release (repeatable; default: every known release of the engine's lines)")
    p.add_argument("--base", metavar="DIST==VERSION",
                   help="the release the copy was written against (default: the one closest to the copy)")
    p.add_argument("--offline", action="store_true", help="no download: the releases already cached")
    add_output_options(p, "also each statement's enclosing blocks")
    return p


def cmd_audit(args: argparse.Namespace, console: Console) -> int:
    from toolkit.kit import _releases as releases
    from toolkit.kit._function_audit import audit

    words = [w for w in (args.first, args.upstream) if w is not None]
    if len(words) != (1 if args.copy else 2):
        raise UsageError("with --copy FILE give only UPSTREAM, the engine's module:qualname" if args.copy else
                         "give COPY and UPSTREAM, or --copy FILE and UPSTREAM")
    copy_spec, upstream = (args.copy, words[0]) if args.copy else (words[0], words[1])
    chosen = [releases.parse_release(spec) for spec in args.releases or ()]
    base = releases.parse_release(args.base) if args.base else None
    status_line = None if args.json or args.quiet else console.status("audit: reading the releases", spinner="dots")
    if status_line:
        status_line.start()
    try:
        report = audit(copy_spec, upstream, copy_qualname=args.copy_qualname, chosen=chosen, base=base,
                       offline=args.offline,
                       progress=(lambda line: status_line.update(f"audit: {line}")) if status_line else None)
    finally:
        if status_line:
            status_line.stop()
    ok = not report.stale_on
    if args.json:
        out.emit_json(ok, copy=report.copy, copy_qualname=report.copy_qualname, upstream=report.upstream,
                      base=report.base, base_chosen=report.base_chosen, stale_on=report.stale_on,
                      releases=[{**asdict(r), "release": r.release} for r in report.releases])
    else:
        print_audit(console, report, args.verbose)
    return 0 if ok else 1


def _statements(statements: Sequence[Any], verbose: bool) -> str:
    lines = []
    for s in statements:
        where = (" > ".join(s.inside) if verbose else s.inside[-1]) if s.inside else "the function's first level"
        lines.append(f"{s.code}  (in {where})")
    return "\n".join(lines)


def print_audit(console: Console, report: Any, verbose: bool) -> None:
    table = Table(title=f"toolkit audit: {report.copy_qualname} ({report.copy}) vs {report.upstream}")
    for column in ("release", "state", "upstream has, the copy drops", "the copy keeps, upstream changed"):
        table.add_column(column, overflow="fold", no_wrap=column in ("release", "state"))
    style = {"current": "green", "stale": "red", "absent": "yellow"}
    for r in report.releases:
        state = r.state if r.release != report.base else f"{r.state} (base)"
        table.add_row(Text(r.release), Text(state, style=style[r.state]), Text(_statements(r.drops, verbose)),
                      Text(_statements(r.freezes, verbose)))
    console.print(table)
    console.print(f"base: {report.base}, {report.base_chosen}", markup=False, highlight=False)
    if report.stale_on:
        console.print(f"stale on {len(report.stale_on)} of {len(report.releases)} release(s): "
                      f"{', '.join(report.stale_on)}", markup=False, highlight=False, soft_wrap=True)
    else:
        console.print(f"current on every release asked ({len(report.releases)})", markup=False, highlight=False)
