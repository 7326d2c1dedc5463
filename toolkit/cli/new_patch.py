"""``toolkit new-patch NAME --engine vllm|sglang``: its arguments and what it prints (the skeleton it writes
is :mod:`toolkit.kit._scaffold`)."""

from __future__ import annotations

import argparse

from rich.console import Console

from toolkit.base import engines
from toolkit.cli import output as out
from toolkit.cli.options import add_output_options
from toolkit.kit import _scaffold as scaffold


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser("new-patch", help="write a patch package of your own that passes its own tests")
    p.add_argument("name", help="the patch id, lowercase words joined by hyphens (my-fix -> toolkit-patch-my-fix)")
    p.add_argument("--engine", required=True, choices=engines.ENGINE_NAMES, help="the engine the patch edits")
    p.add_argument("--dir", dest="directory", metavar="DIR",
                   help="where to write it, a new or empty folder (default: ./toolkit-patch-NAME)")
    add_output_options(p, "also list the files written")
    return p


def cmd_new_patch(args: argparse.Namespace, console: Console) -> int:
    folder = scaffold.new_patch(args.name, args.engine, args.directory)
    files = scaffold.written_files(folder)
    target = scaffold.TARGETS[args.engine]
    if args.json:
        out.emit_json(True, name=args.name, engine=args.engine, versions=target.versions,
                      distribution=scaffold.distribution_of(args.name), package=scaffold.package_of(args.name),
                      directory=str(folder), files=files)
        return 0
    console.print(f"wrote {scaffold.distribution_of(args.name)} ({target.title} patch {args.name}, {target.versions}) "
                  f"in {folder}", markup=False, highlight=False, soft_wrap=True)
    if args.verbose:
        for name in files:
            console.print(f"  {name}", markup=False, highlight=False, soft_wrap=True)
    # the test extra: a fresh venv has no pytest (pyproject's [project.optional-dependencies] test)
    console.print(f"next: cd {folder} && pip install -e '.[test]' && python -m pytest", markup=False, highlight=False,
                  soft_wrap=True)
    return 0
