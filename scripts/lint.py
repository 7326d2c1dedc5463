"""ruff and mypy on the product packages (toolkit/, patches/, verify/, kernels/), configured in pyproject.toml.

scripts/test.sh runs this before pytest; run it alone with the dev venv's python:

    ~/.cache/toolkit/venvs/dev/bin/python scripts/lint.py

mypy checks the package as it installs: setup.py maps patches/ -> toolkit.patches, verify/ -> toolkit.verify
and kernels/ -> toolkit.kernels, a mapping mypy cannot follow from the repository's folders. So it runs
`mypy -p toolkit` over a tree of links laid out as the installed package (in the cache, rebuilt each run)
and prints each finding with its repository path. Exit status: 0 when both pass, 1 otherwise.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("toolkit", "patches", "verify", "kernels")
MAPPED = {"patches": "patches", "verify": "verify", "kernels": "kernels"}  # toolkit.<name> -> repo folder


def cache_dir() -> Path:
    return Path(os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit") / "mypy"


def installed_view(root: Path) -> Path:
    """A folder holding `toolkit/` as it installs: links to toolkit/'s entries plus the mapped folders."""
    view = root / "view"
    shutil.rmtree(view, ignore_errors=True)
    package = view / "toolkit"
    package.mkdir(parents=True)
    for entry in (REPO_ROOT / "toolkit").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name, folder in MAPPED.items():
        (package / name).symlink_to(REPO_ROOT / folder)
    return view


def repo_path(line: str, view: Path) -> str:
    """A mypy line's file named as in the repository (toolkit/patches/x.py -> patches/x.py)."""
    for name, folder in MAPPED.items():
        line = re.sub(rf"^toolkit/{name}/", f"{folder}/", line)
    return line.replace(f"{view}/", "")


def run_ruff() -> bool:
    print("== ruff check " + " ".join(PACKAGES), flush=True)
    ruff = [sys.executable, "-m", "ruff", "check", "--no-cache", *PACKAGES]
    return subprocess.run(ruff, cwd=REPO_ROOT).returncode == 0


def run_mypy() -> bool:
    print("== mypy -p toolkit (toolkit/, patches/, verify/, kernels/ as installed)", flush=True)
    root = cache_dir()
    view = installed_view(root)
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(REPO_ROOT / "pyproject.toml"),
         "--cache-dir", str(root / "cache"), "-p", "toolkit"],
        cwd=view, capture_output=True, text=True,
    )
    for line in (result.stdout + result.stderr).splitlines():
        print(repo_path(line, view))
    return result.returncode == 0


def main() -> int:
    failed = [name for name, ok in (("ruff", run_ruff()), ("mypy", run_mypy())) if not ok]
    if failed:
        print(f"error: {' and '.join(failed)} found problems (listed above); "
              f"configuration in pyproject.toml [tool.ruff] / [tool.mypy]", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
