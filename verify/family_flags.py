"""The server flags a model family is usually served with (its reasoning and tool-call parsers), read from the
model: its config's ``model_type`` and its chat template's markup. `toolkit verify` adds them when it starts
a server, unless the user's own ``--server-arg``s set the same parser (the user's win), and prints them.

docs/families.md lists the same table for people starting a server themselves.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    template_markers: tuple[str, ...]  # all in the chat template: this family's markup
    reasoning: dict[str, str]  # engine -> --reasoning-parser
    tool: dict[str, str]  # engine -> --tool-call-parser


# Order matters: the first family whose model type or template markers match is taken.
FAMILIES: tuple[Family, ...] = (
    Family("gpt-oss", ("gpt_oss",), ("<|channel|>",), {"vllm": "openai_gptoss", "sglang": "gpt-oss"},
           {"vllm": "openai", "sglang": "gpt-oss"}),
    Family("qwen3", ("qwen3", "qwen3_moe"), ("<tool_call>", "</think>"), {"vllm": "qwen3", "sglang": "qwen3"},
           {"vllm": "hermes", "sglang": "qwen25"}),
    Family("llama3", (), ("<|start_header_id|>",), {}, {"vllm": "llama3_json", "sglang": "llama3"}),
    Family("mistral", ("mistral",), ("[INST]",), {}, {"vllm": "mistral", "sglang": "mistral"}),
    Family("gemma3", ("gemma3", "gemma3_text"), ("<start_of_turn>",), {}, {}),
)


def _model_type(model: str) -> str:
    try:
        return str(json.loads((Path(model).expanduser() / "config.json").read_text()).get("model_type") or "")
    except (OSError, ValueError, AttributeError):
        return ""  # a hub id, or no config: the template alone decides


def family_of(model: str, chat_template: str | None) -> Family | None:
    """The family of the model folder ``model`` with ``chat_template`` (the tokenizer's), or None. The template
    decides where there is one (the parsers read what the template makes the model write: a Mistral body under
    a ChatML template is no Mistral to its parser); the config's ``model_type`` only where there is none."""
    if chat_template:
        return next((f for f in FAMILIES if all(marker in chat_template for marker in f.template_markers)), None)
    model_type = _model_type(model)
    return next((f for f in FAMILIES if model_type in f.model_types), None)


def _has(args: Sequence[str], flag: str) -> bool:
    return any(arg == flag or arg.startswith(flag + "=") for arg in args)


def family_args(family: Family | None, engine: str, user_args: Sequence[str]) -> list[str]:
    """The flags ``family`` adds on ``engine`` to ``user_args``: each parser only where the user set none."""
    if family is None:
        return []
    added: list[str] = []
    if engine in family.reasoning and not _has(user_args, "--reasoning-parser"):
        added += ["--reasoning-parser", family.reasoning[engine]]
    if engine in family.tool and not _has(user_args, "--tool-call-parser"):
        if engine == "vllm" and not _has(user_args, "--enable-auto-tool-choice"):
            added.append("--enable-auto-tool-choice")
        added += ["--tool-call-parser", family.tool[engine]]
    return added


def parsers_in(args: Sequence[str]) -> tuple[str, ...]:
    """The reasoning and tool-call parser names set in a server's arguments (accounting reads them)."""
    found = []
    for i, arg in enumerate(args):
        for flag in ("--reasoning-parser", "--tool-call-parser"):
            if arg == flag and i + 1 < len(args):
                found.append(args[i + 1])
            elif arg.startswith(flag + "="):
                found.append(arg.split("=", 1)[1])
    return tuple(found)
