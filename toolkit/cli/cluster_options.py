"""``--ray [ADDRESS]`` of ``toolkit apply-patch``, ``revert`` and ``status``: the command on every alive node of
a Ray cluster (:mod:`toolkit.ray`), one table row or JSON entry per node, exit 1 naming the nodes that failed."""

from __future__ import annotations

import argparse
import contextlib
from typing import Any, Callable

from rich.console import Console

from toolkit.cli import output as out
from toolkit.errors import UsageError


def add_ray_options(parser: argparse.ArgumentParser, seconds: Callable[[str], float]) -> None:
    parser.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                        help="do it on every alive node of the Ray cluster at ADDRESS (default: auto), each node "
                             "with its own toolkit and interpreter; one row per node, exit 1 naming failed nodes")
    parser.add_argument("--node-timeout", type=seconds, default=None, metavar="S",
                        help="with --ray: seconds each node's toolkit run may take (default 600)")


def cmd_on_cluster(args: argparse.Namespace, console: Console) -> int:
    """``--ray``: the command on every alive node of the cluster (toolkit.ray), a row per node."""
    from toolkit.cluster import every_node as cluster  # imports nothing of Ray's until it connects

    unsupported = [flag for flag, on in (("--dry-run", getattr(args, "dry_run", False)),
                                         ("--diff", getattr(args, "diff", False))) if on]
    if unsupported:
        raise UsageError(f"{' and '.join(unsupported)} do{'es' if len(unsupported) == 1 else ''} not go with --ray: "
                         "run it on one node (or with --python) to see what would change")
    if args.node_timeout == 0:
        raise UsageError("--node-timeout must be more than 0 seconds")
    timeout = {"node_timeout": args.node_timeout} if args.node_timeout is not None else {}
    common = dict(address=args.ray, **timeout)
    verb = {"apply-patch": "patching", "revert": "reverting", "status": "reading"}[args.command]
    spinner = (contextlib.nullcontext() if args.json or args.quiet else
               console.status(f"{verb} every node of the Ray cluster...", spinner="dots"))
    error = None
    try:
        with spinner:
            if args.command == "apply-patch":
                report = cluster.apply_patch_on_cluster(
                    args.engine, args.patches, args.python, allow_unknown_version=args.allow_unknown_version,
                    allow_editable=args.allow_editable, force=args.force, lock_timeout=args.lock_timeout, **common)
            elif args.command == "revert":
                report = cluster.revert_patch_on_cluster(args.engine, args.patches, args.python, force=args.force,
                                                         lock_timeout=args.lock_timeout, **common)
            else:
                report = cluster.patch_status_on_cluster(args.engine, args.python, **common)
    except cluster.ClusterPatchError as exc:
        report, error = exc.report, exc
    if args.json:
        fields: dict[str, Any] = {**report.to_json(), **({"error": str(error), "kind": "error"} if error else {})}
        out.emit_json(error is None, **fields)
        return 0 if error is None else 1
    out.print_cluster(console, report, args.verbose)
    if error is not None:
        raise error  # the sentence naming the failed nodes, as every error is printed (main), exit 1
    return 0
