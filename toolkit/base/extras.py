"""Optional parts of this project and the extra that installs each (pyproject's optional-dependencies).

A command that needs a missing extra stops with one sentence naming it, never an ImportError.
"""

from __future__ import annotations

import importlib.util

from toolkit.errors import UsageError

DISTRIBUTION = "serving-toolkit"


class MissingExtra(UsageError):
    """An optional dependency is not installed; the message names the extra that brings it (exit 2)."""


def require(extra: str, modules: tuple[str, ...], feature: str) -> None:
    """Raise :class:`MissingExtra` unless every one of ``modules`` can be imported."""
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtra(
            f"{feature} needs the '{extra}' extra ({', '.join(missing)} not installed): "
            f"pip install '{DISTRIBUTION}[{extra}]'")
