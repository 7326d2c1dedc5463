"""Session-scoped real vLLM servers for the responses-stream end-to-end tests.

Each fixture starts one server (a private copy of the vLLM venv's engine, patched or not), plays
every case against it, stops it by PID and removes its temp dir before returning -- so only one
server runs at a time, and each runs once per session.
"""

from __future__ import annotations

import pytest

from tests.patches.vllm.responses_stream.support import MODEL, serve_and_play, venv_python


def _need_venv() -> None:
    if not venv_python().exists():
        pytest.skip(f"no vLLM venv at {venv_python().parent.parent} (scripts/envs.py builds it)")


@pytest.fixture(scope="session")
def scripted_model() -> str:
    return str(MODEL.make())


@pytest.fixture(scope="session")
def patched_runs(scripted_model: str):
    _need_venv()
    return serve_and_play(scripted_model, patched=True)


@pytest.fixture(scope="session")
def unpatched_runs(scripted_model: str):
    _need_venv()
    return serve_and_play(scripted_model, patched=False)
