"""A private SGLang install for one test session: the venv's interpreter, its own copy of ``sglang``.

The engine venvs are shared: other tests apply and revert patches on them while these run. So the
token-ids tests patch a hard-linked copy of the venv's ``sglang`` package (and its dist-info), put in
front of the venv's site-packages by a wrapper interpreter. The toolkit finds that copy as the
installed engine (``toolkit.engine.discovery``) and, like Python rewriting ``.pyc``, replaces files by
rename, so a hard link is never written through and the venv's own files stay as they are.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from toolkit.patches.sglang.token_ids.patch import PATCH
from tests.harness.fixtures import SHIM_DIR


@dataclass(frozen=True)
class PrivateSglang:
    """A private copy of a venv's ``sglang`` (``private_sglang``)."""

    python: str  # the wrapper interpreter: the copy first on its path
    pythonpath: str  # what the wrapper puts before the caller's PYTHONPATH
    libs_python: str  # the same interpreter and libraries without the copy (a fork server's, group_runs.py)


def private_install(python: str, root: Path) -> str:
    """A wrapper interpreter under ``root`` running ``python`` with a private copy of its sglang;
    the test-only ``sgl_kernel`` shim is on its path too (SGLang 0.5.9 imports it)."""
    return private_sglang(python, root).python


def private_sglang(python: str, root: Path) -> PrivateSglang:
    """``private_install``, with its path and an interpreter of the same libraries without the copy."""
    # Where its sglang is, and the interpreter behind it: an overlay (scripts/envs.py) is a wrapper
    # putting its site directory (that release's sglang and transformers) before the base venv's.
    site_text, interpreter = subprocess.run(
        [python, "-c", "import importlib.util as u, pathlib, sys; "
         "print(pathlib.Path(u.find_spec('sglang').origin).parent.parent); print(sys.executable)"],
        check=True, capture_output=True, text=True, cwd="/").stdout.split("\n")[:2]
    site = Path(site_text)
    overlay = [] if site.name == "site-packages" else [str(site)]
    (root / "site").mkdir(parents=True)
    shutil.copytree(site / "sglang", root / "site" / "sglang", copy_function=os.link)
    for dist_info in site.glob("sglang-*.dist-info"):
        shutil.copytree(dist_info, root / "site" / dist_info.name)
    pythonpath = ":".join([str(root / "site"), *overlay, str(SHIM_DIR)])
    libs_pythonpath = ":".join([*overlay, str(SHIM_DIR)])
    (root / "bin").mkdir()
    wrappers = []
    for name, path in (("python", pythonpath), ("python-libs", libs_pythonpath)):
        wrapper = root / "bin" / name
        wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{path}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{interpreter}" "$@"\n')
        wrapper.chmod(0o755)
        wrappers.append(str(wrapper))
    return PrivateSglang(wrappers[0], pythonpath, wrappers[1])


def sha256s(python: str, patch=PATCH) -> dict[str, str]:
    """sha256 of every file ``patch`` (token-ids by default) edits, in the sglang that ``python`` imports."""
    from toolkit.engine.discovery import find_engines

    (engine,) = [e for e in find_engines(python) if e.engine == "sglang"]
    return {edit.relpath: hashlib.sha256((Path(engine.package_dir) / edit.relpath).read_bytes()).hexdigest()
            for edit in patch.files}
