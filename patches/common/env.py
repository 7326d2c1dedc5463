"""Switches read from the environment, one meaning of "on" for every patch (standard library only:
runtime modules import this inside the engine)."""

from __future__ import annotations

import os

TRUE_VALUES = frozenset({"1", "true", "yes", "on"})


def env_flag(name: str) -> bool:
    """Whether the environment variable ``name`` is set to an "on" value (1, true, yes, on; any case)."""
    return os.environ.get(name, "").strip().lower() in TRUE_VALUES
