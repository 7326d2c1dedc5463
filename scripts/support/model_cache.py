"""A model folder built once into the cache: into a private temporary folder beside it, then renamed into place
(atomic; a concurrent build that finished first wins). scripts/make_tiny_model.py and make_family_model.py."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def build_once(target: Path, build: Callable[[Path], None], marker: str = "model.safetensors") -> Path:
    """``target``, built by ``build(folder)`` unless it already holds ``marker``."""
    if (target / marker).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    os.chmod(tmp, 0o755)
    try:
        build(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / marker).is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
