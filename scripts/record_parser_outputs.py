#!/usr/bin/env python3
"""Record what a real server's reasoning and tool-call parsers make of a model's output, for the server-less
accounting tests (tests/verify/test_accounting.py reads tests/verify/data/parser_outputs.json).

    python scripts/record_parser_outputs.py --engine vllm --python VENV/bin/python --model DIR --label qwen3 \
        [--server-arg=...] [--env K=V] [--out tests/verify/data/parser_outputs.json]

Starts the engine's server with the model family's usual parser flags (toolkit.verify.family_flags) plus the
given ones, sends the verifier's prompts greedy (plain, with a tool offered, and a tool call forced by a
regex in the Hermes format), streamed and not, and adds per request: the decoded completion ids (as the
verifier decodes them), the split the parsers made of them, and the server's parser flags.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from toolkit.verify.checks.check_types import MESSAGES, TOOLS  # noqa: E402
from toolkit.verify.checks.multi_turn import HERMES_CALL, WEATHER_TOOL  # noqa: E402
from toolkit.verify.family_flags import family_args, family_of, parsers_in  # noqa: E402
from toolkit.verify.run import load_tokenizer  # noqa: E402
from toolkit.verify.server import EngineServer  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("vllm", "sglang"), required=True)
    parser.add_argument("--python", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--label", required=True, help="the family's name in the record")
    parser.add_argument("--server-arg", action="append", default=[], dest="server_args")
    parser.add_argument("--env", action="append", default=[], help="K=V for the server")
    parser.add_argument("--out", default=str(REPO / "tests/verify/data/parser_outputs.json"))
    args = parser.parse_args()
    tokenizer = load_tokenizer(args.model)
    family = family_of(args.model, getattr(tokenizer, "chat_template", None))
    server_args = [*args.server_args, *family_args(family, args.engine, args.server_args)]
    env = dict(item.split("=", 1) for item in args.env)
    if args.engine == "sglang":  # on a CPU-only machine SGLang serves only through the test-only shim
        from scripts.support.venvs import sglang_cpu_env

        env = {**sglang_cpu_env(), **env}
    steer = {"structured_outputs": {"regex": HERMES_CALL}} if args.engine == "vllm" else {"regex": HERMES_CALL}
    requests = {"plain": {}, "tools": {"tools": TOOLS},
                "forced-call": {"tools": WEATHER_TOOL, "max_tokens": 96, **steer,
                                "chat_template_kwargs": {"enable_thinking": False}}}
    out = Path(args.out)
    record = json.loads(out.read_text()) if out.exists() else []
    with EngineServer(args.engine, args.python, args.model, server_args=server_args, env=env, timeout=600) as server:
        from toolkit.verify.client import ChatClient

        client = ChatClient(server.base_url, args.model)
        version = str(client.http.get("/version" if args.engine == "vllm" else "/server_info").json().get("version", ""))
        for name, extra in requests.items():
            for stream in (False, True):
                outcome = client.chat(MESSAGES, stream=stream, **extra)
                choice = outcome.choices[0]
                record = [r for r in record if (r["family"], r["engine"], r["request"], r["stream"]) !=
                          (args.label, args.engine, name, stream)]
                record.append({
                    "family": args.label, "engine": args.engine, "engine_version": version, "request": name,
                    "stream": stream, "parsers": list(parsers_in(server_args)),
                    "decoded": tokenizer.decode(choice.token_ids, skip_special_tokens=True),
                    "token_ids": choice.token_ids, "reasoning": choice.split.reasoning,
                    "content": choice.split.content, "tool_calls": [list(c) for c in choice.split.tool_calls]})
        client.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(record)} records in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
