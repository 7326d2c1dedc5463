#!/usr/bin/env python3
"""Build the wheel of every example patch package (``examples/*/pyproject.toml``) and of the catalog
(``catalog/``, serving-toolkit-catalog) into
``<cache>/example-wheels`` (``<cache>`` = ``$TOOLKIT_CACHE_DIR``, default ``~/.cache/toolkit``), each
from a copy of its sources (an in-tree build would leave build/ and egg-info in examples/), offline:
``pip wheel --no-deps --no-build-isolation`` with this interpreter's setuptools. An example's older
wheels there are removed first. tests/examples reads them (and builds its own when one is stale).

``--fetch-slim``: then, with every wheel installed in a temporary folder on ``PYTHONPATH``, run
``scripts/compat_matrix.py --fetch-only``, so the release slim trees hold the files the examples edit
too (tests/examples runs `toolkit matrix --offline` on them), and the catalog's fixes' files. scripts/test.sh's setup runs this.

Exit 1 when any wheel failed to build (the others are still built) or the fetch failed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
CATALOG = REPO / "catalog"


def examples() -> list[Path]:
    return sorted(p.parent for p in EXAMPLES.glob("*/pyproject.toml"))


def distributions() -> list[Path]:
    """Every patch distribution of this repository: each example, then the catalog."""
    return [*examples(), CATALOG]


def wheel_dir() -> Path:
    cache = os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit"
    return Path(cache).expanduser() / "example-wheels"


def build(example: Path, out: Path, python: str = sys.executable) -> Path:
    """``example``'s wheel, built from a copy into ``out``; CalledProcessError with pip's output on failure."""
    with tempfile.TemporaryDirectory(prefix="toolkit-example-") as tmp:
        source = Path(tmp) / example.name
        shutil.copytree(example, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
        with tempfile.TemporaryDirectory(prefix="toolkit-example-wheel-") as built:
            subprocess.run([python, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", built,
                            str(source)], check=True, capture_output=True, text=True)
            (wheel,) = Path(built).glob("*.whl")
            out.mkdir(parents=True, exist_ok=True)
            for stale in out.glob(f"{wheel.name.split('-', 1)[0]}-*.whl"):
                stale.unlink()
            return Path(shutil.copy2(wheel, out / wheel.name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fetch-slim", action="store_true",
                        help="then fetch every release's slim tree with the examples registered")
    parser.add_argument("--jobs", type=int, default=4, help="downloads at once with --fetch-slim (default 4)")
    args = parser.parse_args(argv)
    failed, wheels = 0, []
    for example in distributions():
        try:
            wheels.append(build(example, wheel_dir()))
            print(f"built {wheels[-1].name}", file=sys.stderr)
        except subprocess.CalledProcessError as exc:
            failed = 1
            print(f"error: the wheel of {example.relative_to(REPO)} did not build:\n{exc.stdout}{exc.stderr}",
                  file=sys.stderr)
    if not args.fetch_slim:
        return failed
    with tempfile.TemporaryDirectory(prefix="toolkit-examples-installed-") as target:
        if wheels:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", target,
                            *map(str, wheels)], check=True)
        env = {**os.environ, "PYTHONPATH": target}
        fetched = subprocess.run([sys.executable, str(REPO / "scripts" / "compat_matrix.py"), "--fetch-only",
                                  "--jobs", str(args.jobs)], env=env)
    return failed or (1 if fetched.returncode else 0)


if __name__ == "__main__":
    sys.exit(main())
