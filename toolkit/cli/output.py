"""What the ``toolkit`` commands print: rich tables and lines for people, one JSON object for machines.

Every ``--json`` output is one object carrying ``"schema": 1`` and ``"ok"`` (errors too:
``{"schema": 1, "ok": false, "error": ..., "kind": ...}``); under schema 1 fields are only ever added.
"""

from __future__ import annotations

import errno
import os
import sys
from dataclasses import asdict
from typing import Any, Callable, Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from toolkit.base import outcome
from toolkit.engine.discovery import InstalledEngine

STATE_STYLE = {"applied": "green", "not applied": "dim", "not needed": "dim", "partial": "yellow",
               "drifted": "red", "in progress": "cyan", "patched, no manifest": "red", "runtime missing": "red"}
SHOWN_FILES = 5  # files listed per engine without -v


# Into a pipe or a file a table row is one line, however long: no id, path, anchor or detail is ever
# cut ("v1/core/s…") or wrapped mid-word at an 80-column default, so grep and cut see each value whole.
PIPE_WIDTH = 100_000


def stdout_console(quiet: bool = False) -> Console:
    """What the commands print to: on a terminal rich fits each table to the window (wrapping, never
    cutting an id); anywhere else each table row is one line (see PIPE_WIDTH; ``--json`` stays the
    machine form)."""
    try:
        terminal = sys.stdout.isatty()
    except (ValueError, AttributeError):  # closed, or no real file behind it
        terminal = False
    # StdoutFile has the part of a text stream rich uses (write, flush, isatty, ...), not all of IO[str]
    return OutputConsole(file=StdoutFile(sys.stdout), quiet=quiet,  # type: ignore[arg-type]
                         width=None if terminal else PIPE_WIDTH)


class StdoutError(Exception):
    """stdout refused what a command printed (a full disk, ``/dev/full``, an I/O error), which is not
    a reader closing the pipe early (that stays BrokenPipeError: exit 141)."""

    def __init__(self, exc: OSError) -> None:
        from toolkit.errors import errno_name

        code = f" ({errno_name(exc.errno)})" if exc.errno else ""
        super().__init__(f"cannot write to stdout: {exc.strerror or exc}{code}; what the command did is done, "
                         "only its report is lost (`toolkit status` shows the state)")


class StdoutFile:
    """The stream the commands print to (bound once: rich's live display swaps ``sys.stdout`` out),
    telling a failed write apart from the command's own errors."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutError(exc) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise StdoutError(exc) from None

    def __getattr__(self, name: str) -> Any:  # isatty, fileno, encoding...: the stream's own
        return getattr(self._stream, name)


class OutputConsole(Console):
    def on_broken_pipe(self) -> None:
        """rich's own handler exits 1; a reader that closed the pipe is exit 141, as with ``--json``."""
        self.quiet = True
        raise BrokenPipeError(errno.EPIPE, "stdout closed early")


def stdout_closed() -> bool:
    """Whether the command was started with stdout closed (``toolkit revert >&-``)."""
    stream = sys.stdout
    if stream is None or getattr(stream, "closed", False):
        return True
    try:
        os.fstat(stream.fileno())
    except (OSError, ValueError, AttributeError) as exc:  # no real file behind it (a test's capture) is open
        return getattr(exc, "errno", None) == errno.EBADF
    return False


def say_stdout_closed(more: str = "") -> None:
    """The one sentence of a command started with stdout closed (exit 141)."""
    sys.stderr.write(f"toolkit: stdout is closed, so what this command says would be lost{more}\n")


def record_committed(diff: bool) -> Callable[[Any], None]:
    """apply-patch's and revert's ``on_result``: each engine's ``--json`` entry as soon as it is
    committed, for :func:`emit_interrupted`."""
    if outcome.INTERRUPTED is not None:
        outcome.INTERRUPTED["engines"] = []

    def record(result: Any) -> None:
        if outcome.INTERRUPTED is not None:
            outcome.INTERRUPTED.setdefault("engines", []).append(apply_json(result, diff))

    return record


def emit_interrupted() -> None:
    """The one ``--json`` object of a command ended by a signal: ``"interrupted": true`` and what it
    committed before (apply-patch, revert: ``engines``, each written whole); exit 130."""
    emit_json(False, code=outcome.INTERRUPTED_EXIT, **outcome.interrupted_fields())


def report_error(json_on: bool, errors: Console, exc: Exception, kind: str, code: int | None = None) -> None:
    """A failed command's one sentence: a JSON object on stdout with --json (on stderr if stdout fails), whose
    exit is ``code`` (default 2 for a usage error, else 1)."""
    from toolkit.errors import DriftError

    if json_on:
        extra = {"files": exc.files} if isinstance(exc, DriftError) else {}
        try:
            emit_json(False, code=code if code is not None else (2 if kind == "usage" else 1), error=str(exc),
                      kind=kind, **extra)
            return
        except (StdoutError, BrokenPipeError):
            pass
    errors.print(f"[red]toolkit: {escape(str(exc))}[/red]", highlight=False, soft_wrap=True)


def emit_json(ok: bool, *, code: int | None = None, **fields: Any) -> None:
    """One JSON object on stdout: ``{"schema": 1, "ok": ..., **fields}``, flushed (a write error is a
    :class:`StdoutError` here, not a traceback at exit). Once it is out, the exit code is ``code``
    (default 0 if ``ok`` else 1) whatever comes after, a signal included (:mod:`toolkit.base.outcome`)."""
    outcome.write_object(ok, fields, code, stream=StdoutFile(sys.stdout) if sys.stdout is not None else None)


def silence_stdout() -> None:
    """After a broken pipe (``toolkit status --json | head -1``): point stdout at /dev/null, so that the
    flush at exit fails on nothing (Python's documented recipe for SIGPIPE)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no real file behind sys.stdout (an embedding caller)
        pass


def engine_json(installed: InstalledEngine) -> dict[str, Any]:
    return {"engine": installed.engine, "distribution": installed.distribution, "version": installed.version,
            "package_dir": installed.package_dir, "install_kind": installed.install_kind}


def id_column(table: Table, ids: Sequence[str], name: str = "patch") -> None:
    """The patch-id column: never wrapped or cut, whatever the width (users copy ids into --patch)."""
    table.add_column(name, no_wrap=True, min_width=max([len(i) for i in ids] + [len(name)]), overflow="fold")


def print_list(console: Console, patches: Sequence[Any], verbose: bool) -> None:
    table = Table(title="toolkit patches")
    id_column(table, [p.id for p in patches])
    for column in ("engine", "versions", "files", "summary") + (("runtime modules", "not needed on") if verbose else ()):
        table.add_column(column, no_wrap=column in ("engine", "versions"), overflow="fold")  # fold a path, never cut it
    for p in patches:
        extra = ("\n".join(p.runtime_modules), " ".join(filter(None, p.not_needed))) if verbose else ()
        files = "\n".join(f.relpath + (f" ({f.versions})" if f.versions else "") for f in p.files)  # range: where edited
        versions = p.versions_text + (f"\nnot needed: {p.not_needed[0]}" if p.not_needed[0] else "")  # fixed upstream
        table.add_row(p.id, p.engine, versions, files, p.summary, *extra)
    console.print(table)


def print_plugins(console: Console, plugins: Sequence[Any], verbose: bool) -> None:
    """The engine plugins this package ships (loaded by the engines' own entry points, no patch)."""
    table = Table(title="toolkit plugins (no patch: the engine loads them)")
    id_column(table, [p.id for p in plugins])
    for column in ("engine", "versions", "turn on", "summary") + (("entry point", "not proved") if verbose else ()):
        table.add_column(column, no_wrap=column in ("engine", "versions"))
    for p in plugins:
        extra = (p.entry_point, p.notes) if verbose else ()
        table.add_row(p.id, p.engine, p.versions, p.switch, p.summary, *extra)
    console.print(table)


def print_status(console: Console, rows: Sequence[Any], notes: dict[tuple[str, str], str], verbose: bool) -> None:
    table = Table(title="toolkit status")
    table.add_column("engine")
    table.add_column("version")
    id_column(table, [row.patch_id for row in rows])
    table.add_column("state", no_wrap=True)
    table.add_column("detail", overflow="fold")
    for row in rows:
        state, detail = str(row.state), row.detail
        not_needed = notes.get((row.engine, row.patch_id), "")
        if not_needed:
            state, detail = "not needed", not_needed
        elif not row.supported and row.state != "drifted":  # a drifted row's detail says what to run
            tries = "; --allow-unknown-version tries it" if row.state == "not applied" else ""
            detail = (detail + " " if detail else "") + f"(version not proved{tries})"
        if verbose and row.files:
            detail = "\n".join([detail] * bool(detail) + [f"{relpath}: {s}" for relpath, s in sorted(row.files.items())])
        style = STATE_STYLE.get(state, "default")
        # how it was installed, where it is not a plain install from an index (an editable checkout...)
        install = "" if row.install_kind == "index" else f" ({row.install_kind})"
        table.add_row(row.engine, f"{row.distribution} {row.engine_version}{install}", row.patch_id,
                      f"[{style}]{escape(state)}[/{style}]", escape(detail))
    console.print(table)


def print_files(console: Console, relpaths: Sequence[str], verbose: bool, notes: dict[str, str] | None = None) -> None:
    shown = relpaths if verbose else relpaths[:SHOWN_FILES]
    for relpath in shown:
        note = f" ({notes[relpath]})" if notes and relpath in notes else ""
        console.print(f"  {relpath}{note}", markup=False, highlight=False)
    if len(shown) < len(relpaths):
        console.print(f"  ... and {len(relpaths) - len(shown)} more (-v lists them all)", highlight=False)


def skipped_line(installed: InstalledEngine, skipped: Sequence[dict[str, str]]) -> list[str]:
    """The patches an apply without --patch left out, by why: not needed, or not proved on this release."""
    name = f"{installed.distribution} {installed.version}"
    lines = []
    for reason in ("not needed", "not proved"):
        these = [s for s in skipped if s["reason"] == reason]
        if not these:
            continue
        ids = ", ".join(s["patch"] for s in these)
        if reason == "not needed":
            lines.append(f"  not needed on {name}: {ids} ({'; '.join(dict.fromkeys(s['detail'] for s in these))})")
        else:
            lines.append(f"  skipped (not proved on {name}): {ids} (--allow-unknown-version tries them)")
    return lines


def apply_json(result: Any, diff: bool) -> dict[str, Any]:
    """An engine's entry in apply-patch's and revert's ``--json``: ``applied_patches`` are those applied
    afterwards, ``newly_applied`` those this run applied (dry run: would apply)."""
    entry = {**engine_json(result.engine), "applied_patches": result.patches, "newly_applied": result.newly_applied,
             "changed_files": result.changed_files, "dry_run": result.dry_run, "unchanged": not result.changed,
             "skipped_patches": result.skipped}
    if diff:
        entry["diff"] = result.diff()
    return entry


def print_apply(console: Console, rows: Sequence[tuple[InstalledEngine, Any, list]], *, reverting: bool,
                diff: bool, verbose: bool) -> None:
    for installed, result, skipped in rows:
        name = f"{installed.distribution} {installed.version}"
        applied = ", ".join(result.patches) or "none"
        if diff and result.changed:
            console.print(result.diff(), markup=False, highlight=False, soft_wrap=True)
        if not result.changed:
            line = f"nothing to revert (still applied: {applied})" if reverting else f"already applied ({applied})"
        elif result.dry_run:
            line = (f"would {'revert, changing' if reverting else 'change'} {len(result.changed)} file(s); "
                    f"would leave applied: {applied}")
        elif reverting:
            line = f"reverted, changed {len(result.changed)} file(s); still applied: {applied}"
        else:
            # "applied now" names only what this run applied; a patch applied before is named as such
            already = ", ".join(p for p in result.patches if p not in result.newly_applied)
            if result.newly_applied:
                line = (f"changed {len(result.changed)} file(s); applied now: {', '.join(result.newly_applied)}"
                        + (f" (already applied: {already})" if already else ""))
            else:  # its files were not as patched (reinstalled, or --force over drift): written again
                line = f"changed {len(result.changed)} file(s); patched again: {already} (applied before)"
        console.print(f"{name}: {line}", markup=False, highlight=False)
        if verbose:
            console.print(f"  {installed.package_dir} (python {installed.python})", markup=False, highlight=False)
        print_files(console, result.changed_files, verbose)
        for text in skipped_line(installed, skipped):
            console.print(text, markup=False, highlight=False)


def print_repair(console: Console, results: Sequence[Any], nothing: str, verbose: bool) -> None:
    if not results:
        console.print(nothing, markup=False, highlight=False)
    for r in results:
        if r.orphan:
            console.print(f"{r.engine}: not installed any more; removed its toolkit state", highlight=False)
            continue
        name = f"{r.distribution} {r.version}"
        if r.restored:
            origins = sorted(set(r.restored.values()))
            console.print(f"{name}: restored {len(r.restored)} file(s) to the release's bytes "
                          f"(from {' and '.join(origins)}); patch state cleared", highlight=False)
            print_files(console, sorted(r.restored), verbose, r.restored)
        elif r.cleared_state:
            console.print(f"{name}: files match pip's RECORD; patch state cleared", highlight=False)
        else:
            console.print(f"{name}: files match pip's RECORD; nothing to repair", highlight=False)
        for relpath in r.unverifiable:
            console.print(f"  {relpath}: not in pip's RECORD, left as it is", markup=False, highlight=False)


def check_json(source: Any, checks: Sequence[Any]) -> dict[str, Any]:
    """``check``'s ``--json`` fields: the source, and per patch its verdict, errors and anchors."""
    return dict(source=str(source.origin), engine=source.engine, distribution=source.distribution,
                version=source.version,
                patches=[{"patch": c.patch_id, "supported_version": c.supported, "ok": c.ok, "errors": c.errors,
                          "not_needed": c.not_needed,
                          "anchors": [asdict(a) for a in c.anchors]} for c in checks])


def print_check(console: Console, source: Any, checks: Sequence[Any], verbose: bool) -> None:
    table = Table(title=escape(f"{source.distribution} {source.version}: {source.origin}"))
    id_column(table, [c.patch_id for c in checks])
    for column in ("file", "anchor", "result"):
        table.add_column(column, overflow="fold")
    for check in checks:
        for anchor in check.anchors:
            result = "[green]found[/green]" if anchor.ok else f"[red]{escape(anchor.problem)}[/red]"
            table.add_row(check.patch_id, escape(anchor.relpath), escape(f"{anchor.anchor}: {anchor.description}"), result)
        for error in check.errors:
            table.add_row(check.patch_id, "", "", f"[red]{escape(error)}[/red]")
    console.print(table)
    for check in checks:
        verdict = "[green]would apply[/green]" if check.ok else "[red]would NOT apply[/red]"
        note = "" if check.supported else " (version not proved: needs --allow-unknown-version)"
        note = f" (not needed on this release: {escape(check.not_needed)})" if check.not_needed else note
        found = sum(a.ok for a in check.anchors)
        count = f" ({found} of {len(check.anchors)} anchors found)" if verbose else ""
        console.print(f"{escape(check.patch_id)}: {verdict}{note}{count}", highlight=False)


def print_verify(console: Console, report: Any, verbose: bool) -> None:
    table = Table(title=escape(f"toolkit verify: {report.engine} {report.engine_version}, {report.model}"))
    id_column(table, [row.name for row in report.results], "check")
    for column in ("result", "detail"):
        table.add_column(column)
    style = {"pass": "green", "fail": "red", "error": "red", "skip": "dim"}
    for row in report.results:
        table.add_row(row.name, f"[{style[row.status]}]{row.status}[/{style[row.status]}]", escape(row.detail))
    console.print(table)
    if report.family:
        added = " ".join(report.family_args) if report.family_args else "none (your --server-args set its parsers)"
        console.print(f"model family: {report.family}; server flags added for it: {added}", markup=False,
                      highlight=False)
    if verbose:
        console.print(f"server: {report.base_url or 'none'}; applied patches: {', '.join(report.applied_patches) or 'none'}",
                      markup=False, highlight=False)
    for row in report.results:
        if row.evidence:
            console.print(f"[red]{escape(row.name)}[/red] evidence:", highlight=False)
            for key, value in row.evidence.items():
                console.print(f"  {key}: {value}", markup=False, highlight=False)
    if report.apply_first:
        console.print(f"[yellow]apply these patches first:[/yellow] toolkit apply-patch {report.engine} "
                      + " ".join(f"--patch {p}" for p in report.apply_first), highlight=False)
    if report.error:
        console.print(f"[red]{escape(report.error)}[/red]", highlight=False)
    if report.log_tail:
        console.print("server log (last lines):", highlight=False)
        console.print(report.log_tail, markup=False, highlight=False)
    timing = f" in {report.seconds:.0f}s" + (f" (start-up {report.startup_seconds:.0f}s)" if report.launched else "")
    colour = "green" if report.ok else "red"
    console.print(f"verdict: [{colour}]{report.verdict}[/{colour}] ({len(report.ran)} checks ran){timing}",
                  highlight=False)


def print_cluster(console: Console, report: Any, verbose: bool) -> None:
    """``--ray``: one row per Ray node and engine (toolkit.ray.ClusterReport), then what to start vLLM with."""
    table = Table(title=escape(f"toolkit {report.command} --ray: {len({r.node_id for r in report.nodes})} node(s) "
                               f"of the cluster at {report.address}"))
    for column in ("node", "python", "engine", "patches", "state") + (("files changed", "hostname") if verbose else ()):
        table.add_column(column, no_wrap=column in ("node", "state"), overflow="fold")
    failed = any(not row.ok for row in report.nodes)
    if failed:
        table.add_column("problem")
    for row in report.nodes:
        style = "red" if row.state == "failed" else STATE_STYLE.get(row.state, "default")
        engine = f"{row.distribution} {row.version}" if row.engine else "-"
        extra = (("yes" if row.changed else "no", row.hostname) if verbose else ())
        cells = [row.label, row.python, engine, ", ".join(row.patches) or "-", f"[{style}]{escape(row.state)}[/{style}]"]
        table.add_row(*[escape(c) if i != 4 else c for i, c in enumerate(cells)], *map(escape, extra),
                      *([f"[red]{escape(row.error)}[/red]" if row.error else ""] if failed else []))
    console.print(table)
    env = report.engine_env
    if env:
        console.print("start vLLM with these set, so that each of its processes refuses to start on a node "
                      "without these patches:", markup=False, highlight=False)
        console.print("  export " + " ".join(f"{name}={value}" for name, value in env.items()), markup=False,
                      highlight=False, soft_wrap=True)
