#!/usr/bin/env python3
"""Fetch the engine wheels the codemods are tested against and unpack each one, once.

    python scripts/fetch_sources.py [DIST==VERSION ...] [--json]

Any python 3 runs it (it imports only this checkout's ``toolkit.releases``, standard library only).
Wheels go to ``<cache>/sources/wheels/`` (``pip download --no-deps``, skipped when the wheel is already
there) and each is unpacked into ``<cache>/sources/<dist>-<version>/``, a site-packages-like tree (the
package directory plus its ``.dist-info``). The layout is fixed so tests compute the path themselves.
``<cache>`` is ``$TOOLKIT_CACHE_DIR``, default ``~/.cache/toolkit``. Prints one ``dist==version path``
line per source, or with ``--json`` one object mapping ``"dist==version"`` to the unpacked directory.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # this checkout's toolkit, under a python that has not installed it

from toolkit.kit import _releases as releases  # noqa: E402
from toolkit.errors import PatchError  # noqa: E402
# The cache layout, for the scripts that load this one as a module (scripts/envs.py):
from toolkit.kit._releases import DEFAULT_SOURCES, UNPACKED_MARKER, locked, source_dir, source_lock, sources_dir  # noqa: E402,F401


def fetch(dist: str, version: str) -> Path:
    """``dist==version`` unpacked; a failure is one line and exit 1."""
    try:
        return releases.fetch(dist, version)
    except PatchError as exc:
        sys.exit(f"error: {exc}")


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
