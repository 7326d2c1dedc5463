"""SGLang's own tests for scripts/engine_own_tests.py (issue 50), vendored: the package index has no sglang
sdist after 0.5.10.post1 and CI cannot reach GitHub, so the upstream test files that exercise what our
SGLang patches edit live in ``tests/upstream/sglang-<version>/`` (their repository paths kept), with a
``PINNED.json`` naming the repository, the release, the commit each file was taken at and its sha256.

    python scripts/support/sglang_tests.py --check      the vendored files match PINNED.json (exit 1 if not)
    python scripts/support/sglang_tests.py --record     rewrite PINNED.json's sha256s from the files on disk

Refreshing them is manual (the search tools reach the repository, a script here cannot): for each file
in PINNED.json, read it with the search tool ``read_file`` (repo ``sgl-project/sglang``, its ``path``, and
``commit`` to get the pinned bytes back), write it under the folder, put the commit the answer names into
its entry, run ``--record``, then run ``engine_own_tests.py sglang==<version>`` on the release.

A run copies the folder into ``${TOOLKIT_CACHE_DIR:-~/.cache/toolkit}/engine-tests/sglang-<version>/`` with
a ``pytest.ini`` of its own, so pytest's rootdir is that copy and never this repository (whose
pyproject.toml and conftest.py would load the toolkit's own test plugins)."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
UPSTREAM = REPO_ROOT / "tests" / "upstream"
TESTS_DIR = "test"  # SGLang's tests live in test/ (vLLM's sdist: tests/)
# pytest's rootdir for the copy: no ini above it is read, and the toolkit's conftest.py never loads
PYTEST_INI = "[pytest]\n"


class BadPin(Exception):
    """The vendored files are missing, or differ from PINNED.json: one sentence."""


def folder(version: str) -> Path:
    return UPSTREAM / f"sglang-{version}"


def pinned(version: str) -> dict:
    """PINNED.json of the vendored tests of ``version``."""
    path = folder(version) / "PINNED.json"
    if not path.is_file():
        known = sorted(p.name.removeprefix("sglang-") for p in UPSTREAM.glob("sglang-*") if (p / "PINNED.json").is_file())
        raise BadPin(f"no vendored SGLang tests for {version} (tests/upstream has: {', '.join(known) or 'none'})")
    return json.loads(path.read_text(encoding="utf-8"))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check(version: str) -> dict:
    """PINNED.json, once every file it names is there with its sha256 and no other ``*.py`` is."""
    pin = pinned(version)
    root = folder(version)
    for entry in pin["files"]:
        path = root / entry["path"]
        if not path.is_file():
            raise BadPin(f"{path} is missing (PINNED.json names it)")
        if sha256(path) != entry["sha256"]:
            raise BadPin(f"{path}: sha256 {sha256(path)} differs from PINNED.json's {entry['sha256']}")
    named = {entry["path"] for entry in pin["files"]}
    extra = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")) if root.is_dir() else []
    extra = [rel for rel in extra if rel not in named]
    if extra:
        raise BadPin(f"{', '.join(extra)} in {root} is not in PINNED.json")
    return pin


def record(version: str) -> dict:
    """PINNED.json with each named file's sha256 as it is on disk (after a refresh by hand)."""
    pin = pinned(version)
    for entry in pin["files"]:
        entry["sha256"] = sha256(folder(version) / entry["path"])
    (folder(version) / "PINNED.json").write_text(json.dumps(pin, indent=1) + "\n", encoding="utf-8")
    return pin


def fetch(version: str, cache: Path) -> Path:
    """``engine-tests/sglang-<version>/``: the checked vendored files and a pytest.ini, laid out as in the
    repository (``test/...``); rebuilt whenever PINNED.json changed."""
    pin = check(version)
    root = cache / "engine-tests" / f"sglang-{version}"
    stamp = json.dumps(pin, sort_keys=True)
    if (root / ".complete").is_file() and (root / ".complete").read_text(encoding="utf-8") == stamp:
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".sglang-{version}-", dir=root.parent))
    try:
        for entry in pin["files"]:
            target = scratch / entry["path"]
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(folder(version) / entry["path"], target)
        (scratch / "pytest.ini").write_text(PYTEST_INI, encoding="utf-8")
        (scratch / ".complete").write_text(stamp, encoding="utf-8")
        shutil.rmtree(root, ignore_errors=True)
        os.replace(scratch, root)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return root


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="0.5.23", help="the SGLang release (default 0.5.23)")
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--check", action="store_true", help="the vendored files match PINNED.json")
    action.add_argument("--record", action="store_true", help="rewrite PINNED.json's sha256s from the files")
    args = parser.parse_args(argv)
    try:
        pin = record(args.version) if args.record else check(args.version)
    except BadPin as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"sglang {args.version}: {len(pin['files'])} files, {pin['repo']} "
          + ("recorded" if args.record else "match PINNED.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
