"""What :mod:`toolkit.ray` runs on each node of a Ray cluster: ``python -m toolkit ... --json`` in the node's
own interpreter, its answers sent back whole.

Standard library only, and shipped to the nodes by value (cloudpickle's ``register_pickle_by_value``): a
node whose Python lacks this package still runs it and answers that toolkit is missing there, where a
function pickled by reference would fail to load on that node before it could say anything.
"""

from __future__ import annotations

from typing import Any


def run_toolkit(commands: list[list[str]], timeout: float) -> dict[str, Any]:
    """Run ``<this interpreter> -m toolkit ARGS`` for each ARGS in ``commands``, stopping at the first that
    fails; returns where it ran (interpreter, host, Ray node id) and each run's exit code and output."""
    import os
    import socket
    import subprocess
    import sys
    import tempfile

    answer: dict[str, Any] = {"python": sys.executable, "hostname": socket.gethostname(), "pid": os.getpid(),
                              "node_id": _ray_node_id(), "runs": []}
    # An empty working directory: `python -m` puts it first on sys.path, and a ./toolkit folder there (a
    # checkout the raylet happened to start in) would stand in for the node's installed toolkit.
    with tempfile.TemporaryDirectory(prefix="toolkit-ray-") as empty:
        for args in commands:
            run: dict[str, Any] = {"args": args}
            answer["runs"].append(run)
            try:
                done = subprocess.run([sys.executable, "-m", "toolkit", *args], cwd=empty, stdin=subprocess.DEVNULL,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)
            except subprocess.TimeoutExpired:
                run["timed_out"] = timeout
                break
            except OSError as exc:
                run["os_error"] = f"{type(exc).__name__}: {exc}"
                break
            run.update(returncode=done.returncode, stdout=done.stdout, stderr=done.stderr[-4000:])
            if done.returncode != 0:
                break
    return answer


def _ray_node_id() -> str:
    """The Ray node this task runs on (what the driver pinned it to), or "" outside a Ray worker."""
    import sys

    ray = sys.modules.get("ray")  # a Ray worker has imported it already; elsewhere there is no node
    try:
        return ray.get_runtime_context().get_node_id() if ray is not None else ""
    except Exception:  # a Ray without this API: the driver still knows which node it asked for
        return ""
