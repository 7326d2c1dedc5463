"""The patch engine's guarantees, on a throwaway engine tree: all-or-nothing, idempotent,
byte-for-byte revert, drift detection, locking, and recovery from a crash between writes."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toolkit.engine import patching as engine
from toolkit.errors import AnchorError, DriftError, LockTimeout, PatchError, UsageError
from toolkit.engine.sources import load_source
from toolkit.engine.state import StateDir

from tests.toolkit import demo_patches
from tests.harness import by_id

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def demo_registry(monkeypatch):
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: list(demo_patches.ALL))


@pytest.fixture
def tree(tmp_path):
    return demo_patches.make_engine_tree(tmp_path / "site")


@pytest.fixture
def installed(tree):
    return load_source(tree).as_installed()


def digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".toolkit-state" not in p.parts and "__pycache__" not in p.parts
    }


def states(installed) -> dict[str, str]:
    return {row.patch_id: row.state for row in engine.status(installed)}


def test_apply_edits_files_records_manifest_and_is_idempotent(installed, tree):
    result = by_id.apply(installed, ["demo"])
    assert result.changed_files == ["srt/protocol.py", "srt/serving.py"]
    protocol = (tree / "sglang/srt/protocol.py").read_text()
    assert "token_ids: list | None = None  # toolkit:demo" in protocol
    manifest = StateDir(tree, "sglang").read_manifest()
    assert manifest.state == "applied" and manifest.patches == ["demo"]
    assert manifest.engine_version == "0.5.9" and manifest.toolkit_version
    rec = manifest.files["srt/protocol.py"]
    assert rec.after == hashlib.sha256(protocol.encode()).hexdigest()
    assert rec.before == hashlib.sha256(demo_patches.PROTOCOL.encode()).hexdigest()
    assert states(installed)["demo"] == "applied"

    before = digests(tree)
    mtime = (tree / "sglang/srt/serving.py").stat().st_mtime_ns
    again = by_id.apply(installed, ["demo"])
    assert again.changed == [] and again.patches == ["demo"]
    assert digests(tree) == before
    assert (tree / "sglang/srt/serving.py").stat().st_mtime_ns == mtime


def test_revert_restores_every_file_byte_for_byte_and_clears_state(installed, tree):
    original = digests(tree)
    by_id.apply(installed, ["demo", "second"])
    assert digests(tree) != original
    result = engine.revert(installed)
    assert set(result.changed_files) == {"srt/protocol.py", "srt/serving.py"}
    assert digests(tree) == original
    assert StateDir(tree, "sglang").read_manifest() is None
    assert states(installed) == {"demo": "not applied", "second": "not applied", "broken": "not applied",
                                 "uncompilable": "not applied"}
    assert engine.revert(installed).changed == []  # nothing left to revert


def test_missing_anchor_aborts_whole_apply_naming_patch_file_anchor_and_version(installed, tree):
    original = digests(tree)
    with pytest.raises(AnchorError) as info:
        by_id.apply(installed, ["broken"])
    message = str(info.value)
    assert "broken" in message and "srt/serving.py" in message
    assert "Serving.nonexistent" in message and "sglang 0.5.9" in message and "not found" in message
    # the first file transformed fine in memory, but nothing at all was written
    assert digests(tree) == original
    assert not (tree / ".toolkit-state/sglang/manifest.json").exists()
    assert not (tree / ".toolkit-state/sglang/backups").exists()


def test_result_that_does_not_compile_aborts(installed, tree):
    original = digests(tree)
    with pytest.raises(PatchError, match="does not compile"):
        by_id.apply(installed, ["uncompilable"])
    assert digests(tree) == original


def test_unsupported_version_fails_closed_unless_allowed(tmp_path):
    site = demo_patches.make_engine_tree(tmp_path / "site", version="0.6.0")
    installed = load_source(site).as_installed()
    original = digests(site)
    with pytest.raises(PatchError, match=r"supports sglang >=0.5.9,<=0.5.23.*0.6.0.*--allow-unknown-version"):
        by_id.apply(installed, ["demo"])
    assert digests(site) == original
    assert by_id.apply(installed, ["demo"], allow_unknown_version=True).changed
    # still fails closed on a missing anchor
    engine.revert(installed)
    with pytest.raises(AnchorError):
        by_id.apply(installed, ["broken"], allow_unknown_version=True)
    assert digests(site) == original


def test_dry_run_returns_diffs_and_writes_nothing(installed, tree):
    original = digests(tree)
    result = by_id.apply(installed, ["demo"], dry_run=True)
    diff = result.diff()
    assert "--- a/srt/protocol.py" in diff and "+++ b/srt/protocol.py" in diff
    assert "+    token_ids: list | None = None  # toolkit:demo" in diff
    assert digests(tree) == original
    assert not (tree / ".toolkit-state/sglang/manifest.json").exists()


def test_drift_is_named_and_left_alone_unless_forced(installed, tree):
    original = digests(tree)
    by_id.apply(installed, ["demo"])
    serving = tree / "sglang/srt/serving.py"
    serving.write_text(serving.read_text() + "# edited by hand\n")
    rows = {row.patch_id: row for row in engine.status(installed)}
    assert rows["demo"].state == "drifted" and "srt/serving.py" in rows["demo"].detail
    with pytest.raises(DriftError) as info:
        engine.revert(installed)
    assert info.value.files == ["srt/serving.py"]
    assert serving.read_text().endswith("# edited by hand\n")  # left alone
    assert "token_ids" in (tree / "sglang/srt/protocol.py").read_text()  # whole revert refused
    engine.revert(installed, force=True)
    assert digests(tree) == original


def test_two_patches_on_one_file_revert_one_keeps_the_other(installed, tree):
    by_id.apply(installed, ["demo"])
    by_id.apply(installed, ["second"])
    serving = (tree / "sglang/srt/serving.py").read_text()
    assert "# toolkit:demo" in serving and "# toolkit:second" in serving
    assert states(installed)["demo"] == states(installed)["second"] == "applied"
    by_id.revert(installed, ["demo"])
    serving = (tree / "sglang/srt/serving.py").read_text()
    assert "# toolkit:demo" not in serving and "# toolkit:second" in serving
    assert "token_ids" not in (tree / "sglang/srt/protocol.py").read_text()
    assert states(installed)["demo"] == "not applied" and states(installed)["second"] == "applied"
    # the same bytes as applying `second` alone on a fresh tree
    fresh = demo_patches.make_engine_tree(tree.parent / "fresh")
    by_id.apply(load_source(fresh).as_installed(), ["second"])
    assert (fresh / "sglang/srt/serving.py").read_bytes() == (tree / "sglang/srt/serving.py").read_bytes()


def test_patch_unknown_to_this_toolkit_is_never_dropped_silently(installed, tree, monkeypatch):
    """A patch applied by another toolkit release (absent from this registry) blocks apply and a
    partial revert with a message naming it; a whole revert still restores every original."""
    original = digests(tree)
    by_id.apply(installed, ["demo", "second"])
    patched = digests(tree)
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [p for p in demo_patches.ALL if p.id != "demo"])
    for attempt in (lambda: by_id.apply(installed, ["second"]), lambda: by_id.revert(installed, ["second"])):
        with pytest.raises(PatchError, match="does not know: demo"):
            attempt()
        assert digests(tree) == patched
    engine.revert(installed)
    assert digests(tree) == original


def test_file_mode_kept_and_stale_bytecode_removed(installed, tree):
    serving = tree / "sglang/srt/serving.py"
    os.chmod(serving, 0o444)  # a read-only target file
    cache = tree / "sglang/srt/__pycache__"
    cache.mkdir()
    stale = cache / "serving.cpython-311.pyc"
    stale.write_bytes(b"old")
    keep = cache / "other.cpython-311.pyc"
    keep.write_bytes(b"old")
    by_id.apply(installed, ["demo"])
    assert serving.stat().st_mode & 0o777 == 0o444
    assert "# toolkit:demo" in serving.read_text()
    assert not stale.exists() and keep.exists()
    engine.revert(installed)
    assert serving.stat().st_mode & 0o777 == 0o444
    assert serving.read_text() == demo_patches.SERVING


def test_unknown_patch_id_is_a_usage_error(installed):
    with pytest.raises(UsageError, match="unknown patch for sglang: nope"):
        by_id.apply(installed, ["nope"])


def test_concurrent_run_waits_then_fails_cleanly(installed, tree):
    state = StateDir(tree, "sglang")
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            sys.path.insert(0, {str(REPO)!r})
            from pathlib import Path
            from toolkit.engine.state import StateDir
            with StateDir(Path({str(tree)!r}), "sglang").lock(5):
                print("locked", flush=True)
                time.sleep(30)
        """)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        original = digests(tree)
        with pytest.raises(LockTimeout, match=f"pid {holder.pid}"):
            by_id.apply(installed, ["demo"], lock_timeout=0.5)
        assert digests(tree) == original
    finally:
        holder.kill()
        holder.wait()
    assert by_id.apply(installed, ["demo"], lock_timeout=5).changed  # the lock died with its holder
    assert state.lock_path.exists()


def test_failure_between_file_writes_puts_every_file_back_and_raises_patch_error(installed, tree, monkeypatch):
    """A write that fails after the first file was replaced: the replaced file is put back, the
    manifest is as it was, and the error is a PatchError naming the file (was: partial, OSError)."""
    original = digests(tree)

    def fail_after_first(relpath):
        raise OSError(28, "No space left on device (injected)", str(tree / "sglang" / relpath))

    monkeypatch.setattr("toolkit.engine.journal._after_file_write", fail_after_first)
    with pytest.raises(PatchError, match=r"srt/protocol.py: No space left.*ENOSPC.*put back"):
        by_id.apply(installed, ["demo"])
    monkeypatch.setattr("toolkit.engine.journal._after_file_write", None)
    assert digests(tree) == original
    assert states(installed)["demo"] == "not applied"
    assert not (tree / ".toolkit-state/sglang/manifest.json").exists()
    assert by_id.apply(installed, ["demo"]).changed_files == ["srt/protocol.py", "srt/serving.py"]
    assert states(installed)["demo"] == "applied"
    engine.revert(installed)
    assert digests(tree) == original


def test_failure_while_putting_back_leaves_a_true_journal_that_the_next_run_finishes(installed, tree, monkeypatch):
    """When the undo fails too (the disk stays full), every file is still whole, status says partial,
    and the next apply, or revert, finishes the job."""
    from toolkit.engine import fs

    original = digests(tree)
    real_stage = fs.stage
    full = {"on": False}

    def fail_after_first(relpath):
        full["on"] = True
        raise OSError(28, "No space left on device (injected)")

    def stage(path, data, mode):
        if full["on"]:
            raise OSError(28, "No space left on device (injected)", str(path))
        return real_stage(path, data, mode)

    for finish in (lambda: by_id.apply(installed, ["demo"]), lambda: engine.revert(installed)):
        engine.revert(installed)  # start from the originals each time
        full["on"] = False
        monkeypatch.setattr("toolkit.engine.journal._after_file_write", fail_after_first)
        monkeypatch.setattr(fs, "stage", stage)
        with pytest.raises(PatchError, match="putting the files back failed too"):
            by_id.apply(installed, ["demo"])
        monkeypatch.setattr("toolkit.engine.journal._after_file_write", None)
        monkeypatch.setattr(fs, "stage", real_stage)
        assert states(installed)["demo"] == "partial"
        for relpath, text in (("srt/protocol.py", demo_patches.PROTOCOL), ("srt/serving.py", demo_patches.SERVING)):
            current = (tree / "sglang" / relpath).read_text()
            assert current == text or "# toolkit:demo" in current
        finish()
        assert states(installed)["demo"] in ("applied", "not applied")
    engine.revert(installed)
    assert digests(tree) == original


def test_failure_during_revert_puts_the_patched_files_back(installed, tree, monkeypatch):
    by_id.apply(installed, ["demo"])
    patched = digests(tree)
    monkeypatch.setattr("toolkit.engine.journal._after_file_write", lambda relpath: (_ for _ in ()).throw(OSError("injected")))
    with pytest.raises(PatchError, match="injected"):
        engine.revert(installed)
    monkeypatch.setattr("toolkit.engine.journal._after_file_write", None)
    assert digests(tree) == patched
    assert states(installed)["demo"] == "applied"
    engine.revert(installed)
    assert states(installed)["demo"] == "not applied"


def test_engine_reinstalled_since_patching_is_reported_and_forgotten_with_force(installed, tree):
    by_id.apply(installed, ["demo"])
    # simulate `pip install --force-reinstall` of another version: new files, new metadata
    (tree / "sglang-0.5.9.dist-info").rename(tree / "sglang-0.5.23.dist-info")
    (tree / "sglang-0.5.23.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n")
    (tree / "sglang/srt/serving.py").write_text(demo_patches.SERVING + "# new release\n")
    (tree / "sglang/srt/protocol.py").write_text(demo_patches.PROTOCOL)  # a reinstall replaces every file
    reinstalled = load_source(tree).as_installed()
    assert states(reinstalled)["demo"] == "drifted"
    with pytest.raises(DriftError, match="reinstalled"):
        by_id.apply(reinstalled, ["demo"])
    engine.revert(reinstalled, force=True)
    assert (tree / "sglang/srt/serving.py").read_text().endswith("# new release\n")  # old backup not restored
    assert states(reinstalled)["demo"] == "not applied"
    assert by_id.apply(reinstalled, ["demo"]).changed


def test_sigkill_in_the_middle_of_an_apply(installed, tree):
    original = digests(tree)
    marker = tree.parent / "first-write-done"
    script = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(REPO)!r})
        from pathlib import Path
        from toolkit import patch_registry
        from toolkit.engine import patching as engine, journal
        from toolkit.engine.sources import load_source
        from tests.toolkit import demo_patches
        patch_registry.registry = lambda: list(demo_patches.ALL)
        def pause(relpath):
            Path({str(marker)!r}).write_text(relpath)
            time.sleep(60)
        journal._after_file_write = pause
        engine.apply(load_source(Path({str(tree)!r})).as_installed(), [demo_patches.DEMO])
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO)
    try:
        import time

        deadline = time.monotonic() + 300  # interpreter start and imports; slow only on a loaded machine
        while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), "the apply never reached its first write"
        proc.kill()  # SIGKILL: no cleanup code runs
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    for relpath, text in (("srt/protocol.py", demo_patches.PROTOCOL), ("srt/serving.py", demo_patches.SERVING)):
        current = (tree / "sglang" / relpath).read_text()
        assert current == text or "# toolkit:demo" in current  # whole, either way
    assert states(installed)["demo"] == "partial"
    by_id.apply(installed, ["demo"])
    assert states(installed)["demo"] == "applied"
    # every new file was staged before the first rename; the next run deletes what the killed one staged
    assert not list((tree / "sglang/srt").glob(".*toolkit-tmp"))
    engine.revert(installed)
    assert digests(tree) == original
