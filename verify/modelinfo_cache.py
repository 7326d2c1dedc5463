"""vLLM's model-class inspections kept between servers, when ``TOOLKIT_VLLM_MODELINFO_CACHE`` is set.

vLLM inspects the model class in a subprocess that imports vLLM and torch again (seconds of CPU per
start) unless its cache root has the result. Each server has its own cache root (in its temp dir), so
the kept directory (one subdirectory per engine release) seeds it before the start and takes back
what the server wrote once it is healthy. Off unless the variable is set (the test suite sets it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

__all__ = ["MODELINFO_CACHE_ENV", "modelinfo_dirs", "seed_modelinfos", "save_modelinfos"]

MODELINFO_CACHE_ENV = "TOOLKIT_VLLM_MODELINFO_CACHE"


def modelinfo_dirs(engine: str, release: str, tmp_dir: Path | None) -> tuple[Path, Path] | None:
    """(kept, this server's) directories of the inspections of ``release`` (``distribution-version``)
    for a server whose temp dir is ``tmp_dir``; None unless a vLLM server and the variable is set."""
    kept = os.environ.get(MODELINFO_CACHE_ENV)
    if engine != "vllm" or not kept or tmp_dir is None:
        return None
    return Path(kept) / release, tmp_dir / "vllm-cache" / "modelinfos"


def seed_modelinfos(kept: Path, mine: Path) -> None:
    """Copy what an earlier server of the same release found into this server's cache. vLLM checks each
    entry against the hash of the model's source file, so one that no longer matches is ignored and redone."""
    mine.mkdir(parents=True, exist_ok=True)
    for path in kept.glob("*.json") if kept.is_dir() else ():
        with contextlib.suppress(OSError):
            shutil.copyfile(path, mine / path.name)


def save_modelinfos(kept: Path, mine: Path) -> None:
    """Keep this server's new or changed entries; a failure only loses the speed-up."""
    for path in mine.glob("*.json") if mine.is_dir() else ():
        target = kept / path.name
        with contextlib.suppress(OSError):
            if target.is_file() and target.read_bytes() == path.read_bytes():
                continue
            kept.mkdir(parents=True, exist_ok=True)
            partial = kept / f".{path.name}.{os.getpid()}.partial"
            shutil.copyfile(path, partial)
            os.replace(partial, target)  # atomic: servers of other test workers read it
