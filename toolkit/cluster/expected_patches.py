"""The engine-start check (issue 31): a process of a patched cluster refuses to start on a node whose
engine lacks the cluster's patches, instead of serving a silent mix of patched and unpatched nodes.

With ``TOOLKIT_EXPECT_PATCHES=patch-sweep,tito`` in its environment, every vLLM process (the API server,
the engine core, each worker, Ray's on other nodes included) checks its own install at start through this
package's ``vllm.general_plugins`` entry point, which vLLM calls in every process it starts, and raises
one sentence naming the host, the engine version and each missing patch's state. Without the variable
the entry point returns at once. ``toolkit apply-patch --ray`` prints the variables to set: vLLM's Ray
executor copies only its own variables to its workers, so ``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY`` must name
this one (vLLM 0.24-0.33 all read it).
"""

from __future__ import annotations

import os
from typing import Mapping

from toolkit.errors import PatchError

EXPECT_PATCHES = "TOOLKIT_EXPECT_PATCHES"
RAY_COPY = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"  # vLLM's list of extra variables its Ray executor copies to workers


class UnpatchedEngine(PatchError):
    """This process's engine lacks patches that ``TOOLKIT_EXPECT_PATCHES`` says the cluster runs."""


def expected_patches(environ: Mapping[str, str] | None = None) -> list[str]:
    """The patch ids ``TOOLKIT_EXPECT_PATCHES`` names (comma- or space-separated; none when unset)."""
    value = (os.environ if environ is None else environ).get(EXPECT_PATCHES, "")
    return [word for word in value.replace(",", " ").split() if word]


def engine_start_env(patches: list[str], environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables that make every vLLM process of a Ray cluster check for ``patches`` at start: ours,
    and vLLM's list of variables to copy to its Ray workers with ours added to what ``environ`` has."""
    if not patches:
        return {}
    copied = [name.strip() for name in (os.environ if environ is None else environ).get(RAY_COPY, "").split(",")
              if name.strip()]
    return {EXPECT_PATCHES: ",".join(sorted(set(patches))),
            RAY_COPY: ",".join(copied if EXPECT_PATCHES in copied else [*copied, EXPECT_PATCHES])}


def check_expected_patches(engine: str = "vllm", environ: Mapping[str, str] | None = None,
                           python: str | None = None) -> None:
    """Raise :class:`UnpatchedEngine` when ``engine`` installed for ``python`` (default: this interpreter)
    lacks a patch ``TOOLKIT_EXPECT_PATCHES`` names, or any of them is not in the ``applied`` state."""
    expected = expected_patches(environ)
    if not expected:
        return
    from toolkit.api import patch_status

    rows = patch_status(engine, python)
    where = _where(python)
    if not rows:
        raise UnpatchedEngine(f"{EXPECT_PATCHES} expects {', '.join(expected)}, but {where} has no {engine} "
                              "installed that toolkit can find")
    states = {row.patch_id: str(row.state) for row in rows}
    missing = [f"{patch} ({states.get(patch, 'no such patch in the toolkit installed here')})"
               for patch in expected if states.get(patch) != "applied"]
    if missing:
        release = f"{rows[0].distribution} {rows[0].engine_version}"
        raise UnpatchedEngine(f"{release} on {where} lacks patches the cluster runs ({EXPECT_PATCHES}): "
                              f"{', '.join(missing)}; patch this node before the engine starts here "
                              f"(`toolkit apply-patch --ray` patches every node) or unset {EXPECT_PATCHES}")


def _where(python: str | None) -> str:
    """This node, as an operator finds it: host name, Ray node id when in a Ray worker, interpreter."""
    import socket
    import sys

    node = ""
    ray = sys.modules.get("ray")
    if ray is not None:
        try:
            node = f", Ray node {ray.get_runtime_context().get_node_id()}" if ray.is_initialized() else ""
        except Exception:  # an older Ray without this API: the host name still says which node
            node = ""
    return f"host {socket.gethostname()} ({python or sys.executable}{node})"


def vllm_plugin() -> None:
    """The ``vllm.general_plugins`` entry point: vLLM calls it in every process it starts, and an
    exception here stops that process's start with this package's sentence."""
    if expected_patches():
        check_expected_patches("vllm")
