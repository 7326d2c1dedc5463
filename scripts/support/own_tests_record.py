"""This repository's record of the engines' own tests (issue 50): docs/engine-own-tests.json and its generated
docs/engine-own-tests-skipped.md, written by ``scripts/engine_own_tests.py RELEASE --record`` (``toolkit own-tests
RELEASE --record docs/engine-own-tests.json``; the record's code is toolkit/kit/_own_tests_record.py).
``scripts/compat_matrix.py --write-doc`` reads it for docs/compatibility.md's "own tests" column and section;
tests/conformance/test_engine_own_tests.py checks each CI run collects what is recorded.
"""

from __future__ import annotations

from pathlib import Path

from toolkit.kit._own_tests_record import cell, entry, skipped_markdown, table, load as load_record  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[2]
RECORD = REPO_ROOT / "docs" / "engine-own-tests.json"


def load(path: Path = RECORD) -> dict:
    return load_record(path)
