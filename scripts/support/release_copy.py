"""The release's bytes in a private hard-linked copy of an engine package (vLLM or SGLang), for
scripts/engine_own_tests.py: the shared venv may be patched by another command while it runs, and the
copy must hold the release's files, never a patch (scripts/support/vllm_private.py does the same for vLLM)."""

from __future__ import annotations

import shutil
from pathlib import Path


class StillPatched(Exception):
    """A file of the copy carries a toolkit marker with no backup to undo it."""


def release_files_back(site: Path, root: Path, package: str) -> None:
    """Put the release's bytes back in ``root/package`` from the venv's backups (``site``'s toolkit state),
    as new files (the hard links into the venv are never written through); then no file may carry a marker."""
    from toolkit.patch_registry import markers_in
    from toolkit.engine.state import StateDir

    state = StateDir(site, package)
    for relpath in state.backup_relpaths():
        target = root / package / relpath
        target.unlink(missing_ok=True)
        shutil.copyfile(state.backup_path(relpath), target)
    for path in (root / package).rglob("*.py"):
        if markers_in(path.read_bytes()):
            raise StillPatched(f"{path} still carries a toolkit marker")
