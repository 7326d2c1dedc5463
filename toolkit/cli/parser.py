"""The command line's argument parser: its options, and the one sentence it says for a usage error (with
"did you mean", as JSON under ``--json``), exit 2. Building it imports no command's work."""

from __future__ import annotations

import argparse
import ast
import re
import sys
from typing import Any, NoReturn, Sequence

from toolkit.base import engines
from toolkit.base.version import __version__
from toolkit.cli import output as out
from toolkit.cli.options import add_output_options
from toolkit.cli import audit as audit_cli  # toolkit audit: its arguments and its command
from toolkit.cli import own_tests
from toolkit.cli.cluster_options import add_ray_options
from toolkit.engine.patching import DEFAULT_LOCK_TIMEOUT
from toolkit.cli import new_patch
from toolkit.verify import checks as verify_checks  # the names only: no check module loads
from toolkit.base.suggest import did_you_mean


class _Parser(argparse.ArgumentParser):
    json_errors = False  # set by main() when --json is on the command line: errors go to stdout as JSON
    commands: dict[str, argparse.ArgumentParser] = {}
    argv: list[str] = []

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        self.argv = list(sys.argv[1:] if args is None else args)  # to find the subcommand of an unknown option
        return super().parse_args(args, namespace)

    def error(self, message: str) -> NoReturn:  # one sentence and what to do next, exit 2
        parser: argparse.ArgumentParser = self
        if message.startswith("unrecognized arguments:"):  # reported by the top parser for a subcommand
            command = next((word for word in self.argv if word in self.commands), None)
            parser = self.commands.get(command, self) if command else self
        sentence = f"{message}{_near_miss(parser, message)} (see `{parser.prog} --help`)"
        if _Parser.json_errors:
            out.emit_json(False, code=2, error=sentence, kind="usage")
            self.exit(2)
        parser.print_usage(sys.stderr)
        self.exit(2, f"toolkit: error: {sentence}\n")


def _near_miss(parser: argparse.ArgumentParser, message: str) -> str:
    """ "; did you mean X?" for a misspelt subcommand, engine or option."""
    choice = re.search(r"invalid choice: (.+?) \(choose from", message)
    if choice:
        word = choice.group(1)
        try:
            word = str(ast.literal_eval(word))
        except (ValueError, SyntaxError):
            pass
        choices = [str(c) for action in parser._actions if action.choices for c in action.choices]
        return did_you_mean(word, choices)
    if message.startswith("unrecognized arguments:"):
        options = [o for o in parser._option_string_actions if o.startswith("--")]
        for word in message.split(":", 1)[1].split():
            if word.startswith("--"):
                return did_you_mean(word.split("=", 1)[0], options)
    return ""


class _Version(argparse.Action):
    """``--version``, as JSON when ``--json`` is on the command line too."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: Any, values: Any, option: str | None = None) -> None:
        if out.stdout_closed():  # `toolkit --version >&-`: said nowhere is not said; 141 as every command
            out.say_stdout_closed()
            parser.exit(141)
        if _Parser.json_errors:
            out.emit_json(True, name="serving-toolkit", version=__version__)
        else:
            print(f"toolkit {__version__}")
        parser.exit(0)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (0 <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"seconds must be a finite number >= 0, not {text}")
    return value


def _processes(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number of processes: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"the number of processes must be 1 or more, not {value}")
    return value


def _add_output(parser: argparse.ArgumentParser) -> None:
    add_output_options(parser, "print more detail (every file, per-file states)")


def _add_python(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--python", metavar="PATH", help="the engine's interpreter, or its virtual environment's "
                        "folder (default: this interpreter)")


def _add_common(parser: argparse.ArgumentParser, *, python: bool = True) -> None:
    parser.add_argument("engine", nargs="?", choices=engines.ENGINE_NAMES, help="engine (default: every installed one)")
    if python:
        _add_python(parser)
    _add_output(parser)


def _add_lock_timeout(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lock-timeout", type=_seconds, default=DEFAULT_LOCK_TIMEOUT, metavar="S",
                        help="seconds to wait while another toolkit run holds the engine's lock, then fail "
                             f"(default {DEFAULT_LOCK_TIMEOUT:g})")


def _add_write_options(p: argparse.ArgumentParser, edited_by: str) -> None:
    """The options apply-patch and revert share."""
    _add_common(p)
    add_ray_options(p, _seconds)
    p.add_argument("--patch", action="append", dest="patches", metavar="ID", help="only this patch (repeatable)")
    p.add_argument("--force", action="store_true",
                   help=f"also overwrite files changed since they were patched (only those {edited_by})")
    p.add_argument("--dry-run", action="store_true", help="write nothing; say what would change")
    p.add_argument("--diff", action="store_true", help="show unified diffs")
    _add_lock_timeout(p)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="toolkit", description="Patch installed vLLM and SGLang engines with versioned codemods.")
    parser.add_argument("--version", action=_Version, help="print the version (with --json: as JSON) and exit")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("list", help="list the registered patches (this toolkit's and other installed packages')")
    _add_common(p, python=False)

    p = sub.add_parser("apply-patch", help="apply patches to an installed engine")
    _add_write_options(p, "the patches edit")
    p.add_argument("--allow-unknown-version", action="store_true", help="try an engine version outside a patch's specifier")
    p.add_argument("--allow-editable", action="store_true",
                   help="patch an editable install (pip install -e): that rewrites your own checkout")

    p = sub.add_parser("revert", help="restore the engine's original files byte-for-byte")
    _add_write_options(p, "the reverted patches edit")

    p = sub.add_parser("status", help="which patches are applied, per engine")
    _add_common(p)
    add_ray_options(p, _seconds)

    p = sub.add_parser("repair", help="put the engine's release files back (checked against pip's RECORD), clear the state")
    _add_common(p)
    _add_lock_timeout(p)

    p = sub.add_parser("verify", help="launch a real server and check the token-id contract")
    p.add_argument("--model", required=True, metavar="PATH_OR_NAME",
                   help="the model the server loads and whose tokenizer the checks use: a local folder or a "
                        "Hugging Face name")
    p.add_argument("--engine", choices=engines.ENGINE_NAMES, help="default: the one installed")
    _add_python(p)
    p.add_argument("--server-arg", action="append", dest="server_args", default=[], metavar="ARG",
                   help="extra server argument, repeatable; write --server-arg=--flag for flags")
    p.add_argument("--url", help="verify an already-running server instead of launching one")
    p.add_argument("--checks", metavar="NAMES",
                   help=f"comma-separated check names (default: all): {', '.join(verify_checks.NAMES)}")
    p.add_argument("--timeout", type=_seconds, default=300.0, metavar="S", help="server start-up limit")
    _add_output(p)

    p = sub.add_parser("check", help="would each patch apply to a source tree or wheel (porting tool)")
    p.add_argument("--source", required=True, metavar="PATH", help="a .whl file or an unpacked tree")
    p.add_argument("--release", metavar="DIST==VERSION",
                   help="the release of a folder without dist-info metadata (a source checkout, a copied package)")
    p.add_argument("--patch", action="append", dest="patches", metavar="ID",
                   help="check only this patch, whatever versions it declares (repeatable; default: the patches "
                        "that declare this version, or all of the engine's when none does)")
    _add_output(p)

    p = sub.add_parser("matrix", help="every release of each engine line x every patch: anchors, golden, groups")
    p.add_argument("engine", nargs="?", choices=engines.ENGINE_NAMES, help="engine (default: both)")
    _add_output(p)
    p.add_argument("--patch", action="append", dest="patches", metavar="ID", help="only this patch (repeatable)")
    p.add_argument("--release", action="append", dest="releases", metavar="DIST==VERSION",
                   help="only this release (repeatable; default: every known release of the engine's lines)")
    p.add_argument("--index", action="store_true", help="every release on the package index instead of the known ones")
    p.add_argument("--offline", action="store_true", help="no index and no download: the releases already cached")
    p.add_argument("--jobs", type=_processes, default=1, metavar="N",
                   help="check N patches at once, each in its own process (default 1)")

    new_patch.add_parser(sub)
    audit_cli.add_parser(sub)
    own_tests.add_parser(sub, _seconds)
    _Parser.commands = dict(sub.choices)
    return parser
