"""The one switch for superlinear attention in every engine: ``TOOLKIT_ATTENTION_BACKEND=superlinear``.

Standard library only: the engines' plugins read it in every process, and with the switch off they
must register nothing and import nothing of the kernels (torch included).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

BACKEND_ENV = "TOOLKIT_ATTENTION_BACKEND"
ON_VALUES = ("superlinear",)
OFF_VALUES = ("", "dense", "default", "none")


class SuperlinearConfigError(ValueError):
    """A superlinear-attention setting is malformed; the message names it and what to change."""


def backend_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``TOOLKIT_ATTENTION_BACKEND`` asks for superlinear attention (a bad value raises)."""
    environ = os.environ if environ is None else environ
    value = environ.get(BACKEND_ENV, "").strip().lower()
    if value in ON_VALUES:
        return True
    if value in OFF_VALUES:
        return False
    raise SuperlinearConfigError(
        f"{BACKEND_ENV}={environ.get(BACKEND_ENV)!r} is not understood: use 'superlinear' to turn "
        f"superlinear attention on, or unset it (or 'dense') for the engine's own attention")
