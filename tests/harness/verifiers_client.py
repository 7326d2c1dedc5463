"""verifiers 0.3.1's own token-in client (prime-rl's environments library), unchanged, against a server.

:func:`run_two_turns` runs ``verifiers.legacy.clients.OpenAIChatCompletionsTokenClient`` for a two-turn
exchange the way verifiers' ``MultiTurnEnv`` does (``get_response``, then ``parse_response_message`` and
``parse_response_tokens`` into the trajectory step that the next turn stitches onto): turn 1 goes to
``/v1/chat/completions``, turn 2 through two ``/tokenize`` calls (the ids of the new messages) and
``/v1/chat/completions/tokens``. It returns what happened, every HTTP request included, for the tests
to judge. verifiers falls back silently to plain messages when it cannot stitch (a log line), so the
request log is what tells the two apart.

verifiers is not a dependency of this project: it lives in a side venv under
``$TOOLKIT_CACHE_DIR/side-venvs/verifiers`` (made on first use): a venv whose ``.pth`` adds the test
interpreter's site-packages (the dev venv's: openai, pydantic, httpx, the very same), plus
``pip install --no-deps`` of verifiers and the few pure-Python packages its client modules import.
The client runs in that interpreter (this file, run as a script).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from urllib.parse import urlparse

# verifiers 0.3.1 and what importing its legacy client package needs beyond the dev venv (found by
# importing it in a venv that had only these); 0.4.0 no longer ships the legacy token client.
REQUIREMENTS = ["verifiers==0.3.1", "anthropic==2.13.0", "opentelemetry-api==1.45.2", "docstring_parser==0.18.0",
                "renderers==0.1.12", "prime-pydantic-config==0.4.3", "pydantic-settings==2.16.3",
                "python-dotenv==1.2.4", "tenacity==9.2.1"]
FIRST = "Name three prime numbers."
SECOND = "And the next three?"


def _index_reachable() -> tuple[bool, str]:
    """Whether pip's index answers a TCP connection (its host from PIP_INDEX_URL, else pypi.org)."""
    url = os.environ.get("PIP_INDEX_URL") or "https://pypi.org/simple"
    parsed = urlparse(url)
    if parsed.scheme == "file":
        return True, url
    host, port = parsed.hostname or "pypi.org", parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=10).close()
        return True, url
    except OSError as exc:
        return False, f"{url} is unreachable ({exc})"


def verifiers_python() -> Path:
    """The side venv's Python with verifiers installed (made on first use); skips the test when the
    package index cannot be reached, fails it when pip fails otherwise."""
    from tests.harness.fixtures import toolkit_cache_dir

    # the tests' own interpreter (the dev venv; asking scripts/envs.py for it from inside it fails when its
    # recipe changed); resolved: parallel test workers reach the one dev venv through their caches' symlinks
    dev_site = Path(sysconfig.get_paths()["purelib"]).resolve()
    root = toolkit_cache_dir() / "side-venvs" / "verifiers"
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / ".verifiers.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time (test workers share side-venvs/)
        return _build(root, dev_site)


def _build(root: Path, dev_site: Path) -> Path:
    import pytest

    python = root / "bin" / "python"
    stamp = root / ".requirements"
    wanted = json.dumps([REQUIREMENTS, str(dev_site)])
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(root)], check=True, capture_output=True, text=True)
    site = next((root / "lib").glob("python3*/site-packages"))
    # addsitedir also runs the dev site's own .pth files (this project's editable install)
    (site / "_dev_site.pth").write_text(f"import site; site.addsitedir({str(dev_site)!r})\n")
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", *REQUIREMENTS],
                          check=False, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        reachable, where = _index_reachable()
        if not reachable:
            pytest.skip(f"verifiers 0.3.1 cannot be installed: the package index {where}")
        lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("WARNING")]
        pytest.fail(f"pip install of verifiers 0.3.1 into {root} failed: {' / '.join(lines[-3:])}", pytrace=False)
    stamp.write_text(wanted)
    return python


def run_two_turns(base_url: str, model: str, eos_id: int, timeout: float = 300) -> dict:
    """verifiers' token client against ``base_url`` (the server root, no /v1): two turns, greedy.

    Turn 1 gets 4 tokens then its end of turn (``min_tokens`` and a ``logit_bias`` on ``eos_id``): a
    truncated turn is one verifiers never stitches onto."""
    python = verifiers_python()
    spec = {"base_url": base_url, "model": model, "eos_id": eos_id}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        done = subprocess.run([str(python), __file__, json.dumps(spec), str(out)], check=False, capture_output=True,
                              text=True, timeout=timeout)
        if done.returncode != 0 or not out.exists():
            raise AssertionError(f"verifiers' client failed (exit {done.returncode}): {done.stderr[-3000:]}")
        return json.loads(out.read_text())


ROUTES = [["POST", "/v1/chat/completions", 200], ["POST", "/tokenize", 200], ["POST", "/tokenize", 200],
          ["POST", "/v1/chat/completions/tokens", 200]]


def assert_stitched(result: dict, tokenizer) -> None:
    """Turn 2 went through verifiers' token path (not its silent fallback to messages) and its prompt
    is turn 1's prompt + completion ids exactly, then what the chat template puts after them."""
    assert "error" not in result, f"verifiers' client failed at {result.get('error')}; requests: {result['requests']}"
    assert result["requests"] == ROUTES, f"requests {result['requests']}, verifiers' log {result['log']}"
    first, second = result["turns"]
    assert first["finish_reason"] == "stop" and not first["is_truncated"], first
    prefix = first["prompt_ids"] + first["completion_ids"]
    assert second["prompt_ids"][: len(prefix)] == prefix, (prefix, second["prompt_ids"])
    rest = tokenizer.decode(second["prompt_ids"][len(prefix):])
    conversation = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": first["content"]},
                    {"role": "user", "content": SECOND}]
    templated = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert SECOND in rest and templated.endswith(rest), (rest, templated)
    assert second["completion_ids"] and second["completion_logprobs"] == len(second["completion_ids"]), second


# --------------------------------------------------------------------------------------------------
# the driver, run by the side venv's Python: verifiers' code as its environments call it


async def _drive(spec: dict) -> dict:
    import logging

    import httpx
    from openai import AsyncOpenAI
    from verifiers.legacy.clients import OpenAIChatCompletionsTokenClient
    from verifiers.legacy.types import TrajectoryStep, UserMessage
    from verifiers.legacy.utils.message_utils import concat_messages
    from verifiers.legacy.utils.response_utils import (
        parse_response_message,
        parse_response_tokens,
    )

    requests: list[list] = []
    warnings: list[str] = []

    async def record(response: httpx.Response) -> None:
        requests.append([response.request.method, response.request.url.path, response.status_code])

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            warnings.append(record.getMessage())

    logging.getLogger("verifiers").addHandler(Collect(logging.DEBUG))
    logging.getLogger("verifiers").setLevel(logging.DEBUG)
    http = httpx.AsyncClient(event_hooks={"response": [record]}, timeout=120)
    client = OpenAIChatCompletionsTokenClient(AsyncOpenAI(base_url=spec["base_url"] + "/v1", api_key="none",
                                                          http_client=http, max_retries=0))
    model = spec["model"]
    # enable_thinking false: a reasoning parser (the vLLM test server runs qwen3's) reads a reply without
    # </think> as all reasoning, and verifiers then sends the assistant turn as content null and
    # tool_calls null, which vLLM's request validation refuses (upstream, patched or not)
    sampling = {"max_tokens": 12, "temperature": 0.0, "logit_bias": {str(spec["eos_id"]): 100},
                "extra_body": {"min_tokens": 4, "chat_template_kwargs": {"enable_thinking": False}}}
    state: dict = {"model": model, "trajectory": [], "trajectory_id": "t"}
    turns = []
    prompt = [UserMessage(content=FIRST)]
    for next_message in (SECOND, None):
        try:
            response = await client.get_response(prompt, model, sampling, None, state=state)
        except Exception as exc:  # noqa: BLE001 (verifiers wraps the cause in an empty ModelError: name the chain)
            chain = []
            while exc is not None:
                chain.append(f"{type(exc).__name__}: {str(exc)[:600]}")
                exc = exc.__cause__ or exc.__context__
            return {"turns": turns, "requests": requests, "log": warnings,
                    "error": f"turn {len(turns) + 1}: " + " <- ".join(chain)}
        completion = await parse_response_message(response)
        tokens = await parse_response_tokens(response)
        is_truncated = bool(response.message.is_truncated or tokens.get("is_truncated"))  # as MultiTurnEnv
        turns.append({"prompt_ids": tokens["prompt_ids"], "completion_ids": tokens["completion_ids"],
                      "completion_logprobs": len(tokens["completion_logprobs"]), "is_truncated": is_truncated,
                      "finish_reason": response.message.finish_reason, "content": response.message.content})
        state["trajectory"].append(TrajectoryStep(prompt=prompt, completion=completion, response=response,
                                                  tokens=tokens, reward=None, advantage=None,
                                                  is_truncated=is_truncated, trajectory_id="t", extras={}))
        if next_message is not None:
            prompt = concat_messages([prompt, completion, [UserMessage(content=next_message)]])
    await http.aclose()
    return {"turns": turns, "requests": requests, "log": warnings}


if __name__ == "__main__":
    import asyncio

    result = asyncio.run(_drive(json.loads(sys.argv[1])))
    Path(sys.argv[2]).write_text(json.dumps(result))
