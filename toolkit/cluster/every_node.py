"""Patch every node of a Ray cluster (issue 31), behind the public face :mod:`toolkit.ray`.

A source patch must be on each node's own install before the engine starts there. Each alive node gets one
task pinned to it (``NodeAffinitySchedulingStrategy(node, soft=False)``), which runs that node's own
``python -m toolkit COMMAND --json`` in the node's own interpreter (the Ray worker's ``sys.executable``), so
every node is patched by the toolkit installed beside its engine. The answers come back as one row per node
and engine; a node that failed (toolkit missing there, a patch that cannot apply, no answer in time, a
node whose patches differ from the others') makes the call raise :class:`ClusterPatchError`, which names
each such node and still carries every row.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator, Sequence

from toolkit.base import engines
from toolkit.engine import patching
from toolkit.cluster.connect import connected, first_line
from toolkit.api import check_lock_timeout, check_patches_arg
from toolkit.errors import PatchError, UsageError
from toolkit.cluster.expected_patches import engine_start_env
from toolkit.base.version import __version__

DEFAULT_NODE_TIMEOUT = 600.0  # seconds one node's toolkit run may take (a cold apply of every patch: ~half a minute)
SCHEDULE_SLACK = 120.0  # on top: starting a Ray worker on the node and shipping the answer back
SETTLED = ("applied", "not applied")  # every other state is a problem to report (partial, drifted, ...)


@dataclass
class NodeResult:
    """One node's answer for one engine (a node that failed before any engine was found: one row, no engine)."""

    node_id: str
    node: str  # the node's name in Ray: its IP address unless `ray start --node-name` gave it one
    hostname: str = ""
    python: str = ""  # the interpreter that ran toolkit there
    engine: str = ""
    distribution: str = ""
    version: str = ""
    patches: list[str] = field(default_factory=list)  # applied there after the command
    states: dict[str, str] = field(default_factory=dict)  # every patch toolkit knows there -> its state
    state: str = ""  # "applied", "not applied", "some applied", a problem state, or "failed"
    changed: bool = False  # the command wrote files on this node
    error: str = ""  # why this node failed: one sentence; "" when it did not

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def label(self) -> str:
        """How messages name the node: its name and the start of its id (several nodes share one IP)."""
        return f"{self.node} ({self.node_id[:12]})" if self.node_id else self.node


@dataclass
class ClusterReport:
    command: str  # apply-patch, revert or status
    address: str
    nodes: list[NodeResult]

    @property
    def failed(self) -> list[NodeResult]:
        return [row for row in self.nodes if not row.ok]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def changed(self) -> bool:
        return any(row.changed for row in self.nodes)

    @property
    def engine_env(self) -> dict[str, str]:
        """The variables to start vLLM with, so that each of its processes, on every node, refuses to start
        on an install without the patches every node has now (:mod:`toolkit.cluster.expected_patches`); empty when no
        vLLM patch is applied or a node failed."""
        vllm = [row for row in self.nodes if row.engine == "vllm"]
        if not vllm or not self.ok:
            return {}
        return engine_start_env(sorted(set.intersection(*(set(row.patches) for row in vllm))))

    def to_json(self) -> dict[str, Any]:
        return {"command": self.command, "address": self.address, "nodes": [asdict(row) for row in self.nodes],
                "failed_nodes": [row.label for row in self.failed], "engine_env": self.engine_env}


class ClusterPatchError(PatchError):
    """Some nodes failed; the message names each with its reason, ``report`` holds every node's row."""

    def __init__(self, report: ClusterReport) -> None:
        self.report = report
        failed = report.failed
        reasons = "; ".join(f"{row.label}: {row.error}" for row in failed)
        super().__init__(f"toolkit {report.command} failed on {len(failed)} of {len({r.node_id for r in report.nodes})} "
                         f"Ray node(s): {reasons}")

    @property
    def failed(self) -> list[NodeResult]:
        return self.report.failed


def apply_patch_on_cluster(engine: str | None = None, patches: Sequence[str] | None = None, python: str | None = None,
                           *, address: str | None = None, allow_unknown_version: bool = False,
                           allow_editable: bool = False, force: bool = False,
                           lock_timeout: float = patching.DEFAULT_LOCK_TIMEOUT,
                           node_timeout: float = DEFAULT_NODE_TIMEOUT) -> ClusterReport:
    """:func:`toolkit.apply_patch` on every alive node of the Ray cluster at ``address`` (default: the one
    this process is connected to, else ``"auto"``); ``python``: the engine's interpreter on each node
    (default: the node's Ray worker's). Returns every node's row; raises :class:`ClusterPatchError` naming
    the nodes that failed, :class:`UsageError` when ray is missing or no cluster answers."""
    args = _selection_args(engine, patches, python, lock_timeout)
    args += [flag for flag, on in (("--allow-unknown-version", allow_unknown_version),
                                   ("--allow-editable", allow_editable), ("--force", force)) if on]
    return _on_cluster("apply-patch", args, engine, python, address, node_timeout, wanted="applied")


def revert_patch_on_cluster(engine: str | None = None, patches: Sequence[str] | None = None, python: str | None = None,
                            *, address: str | None = None, force: bool = False,
                            lock_timeout: float = patching.DEFAULT_LOCK_TIMEOUT,
                            node_timeout: float = DEFAULT_NODE_TIMEOUT) -> ClusterReport:
    """:func:`toolkit.revert_patch` (default: every patch) on every alive node, byte-for-byte; the same
    rows and errors as :func:`apply_patch_on_cluster`."""
    args = _selection_args(engine, patches, python, lock_timeout) + (["--force"] if force else [])
    return _on_cluster("revert", args, engine, python, address, node_timeout, wanted="not applied",
                       selected=list(patches) if patches else None)


def patch_status_on_cluster(
    engine: str | None = None,
    python: str | None = None,
    *,
    address: str | None = None,
    node_timeout: float = DEFAULT_NODE_TIMEOUT,
) -> ClusterReport:
    """:func:`toolkit.patch_status` on every alive node. Raises :class:`ClusterPatchError` naming each node
    whose patches are partial, drifted, or fewer than another node's of the same engine (a mix the
    engine would otherwise run silently), or that could not answer."""
    return _on_cluster("status", _selection_args(engine, None, python, None), engine, python, address, node_timeout)


def _selection_args(engine: str | None, patches: Sequence[str] | None, python: str | None,
                    lock_timeout: float | None) -> list[str]:
    check_patches_arg(patches)
    engines.check_engine(engine)
    args = [engine] if engine else []
    for patch in patches or ():
        args += ["--patch", patch]
    if python is not None:
        args += ["--python", python]  # as given: each node resolves the path on its own disk
    if lock_timeout is not None:
        args += ["--lock-timeout", repr(check_lock_timeout(lock_timeout))]
    return args


def _on_cluster(command: str, args: list[str], engine: str | None, python: str | None, address: str | None,
                node_timeout: float, *, wanted: str | None = None, selected: list[str] | None = None) -> ClusterReport:
    if isinstance(node_timeout, bool) or not isinstance(node_timeout, (int, float)) or not 0 < node_timeout < float("inf"):
        raise UsageError(f"node_timeout must be a finite number of seconds > 0, not {node_timeout!r}")
    status_args = ["status", *([engine] if engine else []), *(["--python", python] if python else []), "--json"]
    commands = [status_args] if command == "status" else [[command, *args, "--json"], status_args]
    with connected(address) as (ray, where):
        answers = _run_on_every_node(ray, commands, float(node_timeout))
    report = ClusterReport(command, where, [row for node, answer in answers for row in
                                            _rows(node, answer, command, wanted, selected)])
    _report_mixes(report)
    usage = _same_usage_error(report)
    if usage:
        raise UsageError(usage)
    if not report.ok:
        raise ClusterPatchError(report)
    return report


@dataclass
class _Node:
    node_id: str
    name: str


@dataclass
class _Answer:
    reply: dict[str, Any] | None = None  # what ray_node.run_toolkit returned
    error: str = ""  # why there is no reply


def _run_on_every_node(ray: Any, commands: list[list[str]], node_timeout: float) -> list[tuple[_Node, _Answer]]:
    """One task per alive node, pinned there, each running ``commands`` in the node's interpreter."""
    from ray import cloudpickle
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from toolkit.cluster import ray_node

    # By value, so that a node without this package can load the task and say so (toolkit.cluster.ray_node).
    cloudpickle.register_pickle_by_value(ray_node)
    nodes = [_Node(n["NodeID"], str(n.get("NodeName") or n.get("NodeManagerAddress") or "?"))
             for n in ray.nodes() if n.get("Alive")]
    if not nodes:
        raise UsageError("the Ray cluster has no alive node")
    task = ray.remote(num_cpus=0, max_retries=0)(ray_node.run_toolkit)
    refs = {node.node_id: task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False),
                                       name=f"toolkit {commands[0][0]}").remote(commands, node_timeout)
            for node in nodes}
    wait = node_timeout * len(commands) + SCHEDULE_SLACK
    done, pending = ray.wait(list(refs.values()), num_returns=len(refs), timeout=wait)
    answers = []
    for node in nodes:
        ref = refs[node.node_id]
        if ref in pending:
            ray.cancel(ref, force=True)
            answers.append((node, _Answer(error=f"no answer within {wait:g} s (its task was cancelled)")))
            continue
        try:
            answers.append((node, _Answer(reply=ray.get(ref))))
        except Exception as exc:  # the task could not run there: node died, worker crashed, unschedulable
            answers.append((node, _Answer(error=f"its task failed ({type(exc).__name__}: {first_line(exc)})")))
    return answers


def _rows(node: _Node, answer: _Answer, command: str, wanted: str | None,
          selected: list[str] | None) -> Iterator[NodeResult]:
    base = NodeResult(node.node_id, node.name)
    reply = answer.reply or {}
    base.hostname, base.python = reply.get("hostname", ""), reply.get("python", "")
    if answer.error:
        yield _failed(base, answer.error)
        return
    if reply.get("node_id") not in ("", None, node.node_id):  # affinity is hard: never expected
        yield _failed(base, f"its task ran on node {reply['node_id']} instead")
        return
    runs = reply.get("runs", [])
    outputs = []
    for run in runs:
        output, problem = _parse_run(run, base.python)
        if problem:
            yield _failed(base, problem)
            return
        outputs.append(output)
    status = outputs[-1]
    applied_by_command: dict[str, list[str]] = {}
    changed_engines: set[str] = set()
    if command != "status":
        for entry in outputs[0].get("engines", []):
            applied_by_command[entry["engine"]] = list(entry.get("applied_patches", []))
            if not entry.get("unchanged", True):
                changed_engines.add(entry["engine"])
    by_engine: dict[str, list[dict[str, Any]]] = {}
    for patch_row in status.get("patches", []):
        by_engine.setdefault(patch_row["engine"], []).append(patch_row)
    if not by_engine:  # `status` on a node without the engine: a state, not a failure (apply/revert failed above)
        yield NodeResult(**{**asdict(base), "state": "not installed"})
        return
    for engine, patch_rows in sorted(by_engine.items()):
        states = {p["patch_id"]: p["state"] for p in patch_rows}
        row = NodeResult(**{**asdict(base), "engine": engine, "distribution": patch_rows[0].get("distribution", ""),
                            "version": patch_rows[0].get("engine_version", ""), "states": states,
                            "patches": sorted(p for p, s in states.items() if s == "applied"),
                            "changed": engine in changed_engines})
        if command == "apply-patch":
            relevant = applied_by_command.get(engine, [])
        elif command == "revert":
            relevant = [p for p in states if selected is None or p in selected]
        else:
            relevant = [p["patch_id"] for p in patch_rows if p.get("supported") or p["state"] != "not applied"]
        row.state = _summary({p: states.get(p, "unknown") for p in relevant})
        problems = [f"{p} is {states.get(p, 'unknown')}" + _detail(patch_rows, p) for p in relevant
                    if states.get(p) not in SETTLED or (wanted and states.get(p) != wanted)]
        if problems:
            row.error = f"after `toolkit {command}` there: {'; '.join(problems)}"
        yield row


def _parse_run(run: dict[str, Any], python: str) -> tuple[dict[str, Any], str]:
    """One ``python -m toolkit ... --json`` run's JSON object, or why there is none (one sentence)."""
    command = f"toolkit {run['args'][0]}"
    if "timed_out" in run:
        return {}, f"{command} did not finish within {run['timed_out']:g} s"
    if "os_error" in run:
        return {}, f"cannot run {python} -m toolkit: {run['os_error']}"
    stderr = run.get("stderr", "")
    if "No module named toolkit" in stderr:
        return {}, (f"toolkit is not installed for {python} on this node; `pip install serving-toolkit=={__version__}` "
                    "there (the engine's interpreter), then run this again")
    try:
        output = json.loads(run.get("stdout", ""))
        assert isinstance(output, dict)
    except (ValueError, AssertionError):
        last = next((line for line in reversed(stderr.splitlines()) if line.strip()), "no output")
        return {}, f"{command} exited {run.get('returncode')} without a JSON answer: {last.strip()}"
    if output.get("error"):
        return output, str(output["error"]) + (" [usage]" if output.get("kind") == "usage" else "")
    if run["args"][0] != "status" and run.get("returncode") != 0:  # status exits 1 on a problem: rows tell
        return output, f"{command} exited {run.get('returncode')}"
    return output, ""


def _failed(base: NodeResult, error: str) -> NodeResult:
    return NodeResult(**{**asdict(base), "state": "failed", "error": error})


def _summary(states: dict[str, str]) -> str:
    values = list(states.values())
    problem = next((s for s in values if s not in SETTLED), None)
    if problem:
        return problem
    if values and all(s == "applied" for s in values):
        return "applied"
    return "not applied" if all(s == "not applied" for s in values) else "some applied"


def _detail(patch_rows: list[dict[str, Any]], patch: str) -> str:
    detail = next((p.get("detail", "") for p in patch_rows if p["patch_id"] == patch), "")
    return f" ({detail})" if detail else ""


def _report_mixes(report: ClusterReport) -> None:
    """A patch applied on some nodes of an engine but not on others is what the engine must never run
    silently: each node without it gets an error naming the patches and the nodes that have them."""
    by_engine: dict[str, list[NodeResult]] = {}
    for row in report.nodes:
        if row.engine:
            by_engine.setdefault(row.engine, []).append(row)
    for rows in by_engine.values():
        everywhere = set.union(*(set(row.patches) for row in rows))
        for row in rows:
            lacking = sorted(everywhere - set(row.patches))
            if lacking and not row.error:
                others = sorted({other.label for other in rows if set(lacking) & set(other.patches)})
                row.error = (f"{row.distribution} {row.version} here lacks {', '.join(lacking)}, which "
                             f"{', '.join(others)} ha{'s' if len(others) == 1 else 've'}")


def _same_usage_error(report: ClusterReport) -> str:
    """A usage mistake every node reports alike (a misspelt patch id): one usage error, not a table of them."""
    errors = {row.error for row in report.nodes}
    if len(errors) == 1:
        (error,) = errors
        if error.endswith(" [usage]") and "not installed" not in error:
            return error[: -len(" [usage]")] + " (on every Ray node)"
    for row in report.nodes:
        row.error = row.error.removesuffix(" [usage]")
    return ""
