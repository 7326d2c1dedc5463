"""catalog/README.md's table is what scripts/catalog_table.py writes from catalog/findings.toml and the
fixes' declarations, covers the five frameworks with a state on every row, and a malformed finding is
one sentence and exit 1 (no traceback)."""

from __future__ import annotations

import subprocess
import sys

from tests.harness.fixtures import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "catalog_table.py"


def test_the_table_is_current():
    check = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_it_covers_the_five_frameworks_and_every_row_has_a_state():
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    try:
        import catalog_table
    finally:
        sys.path.remove(str(REPO_ROOT / "scripts"))
    rows = catalog_table.rows()
    assert {row[0] for row in rows} == set(catalog_table.FRAMEWORKS)
    assert all(row[5].startswith(("ported: ", "not needed", "cannot be a codemod: ", "not ported yet: ")) for row in rows)
    assert sum(row[5].startswith("ported") for row in rows) >= 7


def test_a_ported_row_naming_no_fix_is_one_sentence(tmp_path, monkeypatch):
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    try:
        import catalog_table
    finally:
        sys.path.remove(str(REPO_ROOT / "scripts"))
    findings = tmp_path / "findings.toml"
    findings.write_text(catalog_table.FINDINGS.read_text().replace('patch = "hybrid-kv-cache-wake"',
                                                                   'patch = "no-such-fix"'))
    monkeypatch.setattr(catalog_table, "FINDINGS", findings)
    assert catalog_table.main(["--check"]) == 1
