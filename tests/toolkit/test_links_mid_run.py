"""Symbolic links that appear while an apply or revert runs (issue 57): planted after the check that
refuses the links present at the start, while the codemods run or between two renames.

Every write walks down from site-packages without following a link (``toolkit.engine.fs.confined``),
and a file's mode is read from the file itself (``fstat`` of a descriptor opened with ``O_NOFOLLOW``): the
run stops in one sentence naming the link, every file is put back, nothing is written through the link
or over it, and the link stays a link. A ``__pycache__`` that is a link is refused the same way (apply
deleted the bytecode inside the link's target, outside site-packages). Also: a backup is never more open
than the release file it keeps (a 0600 file's backup was 0644).
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.harness import by_id
from tests.toolkit import demo_patches
from tests.toolkit.test_install_shapes import snapshot
from toolkit.engine import fs
from toolkit.engine import patching as engine
from toolkit.engine.sources import load_source
from toolkit.engine.state import StateDir
from toolkit.errors import PatchError

pytestmark = pytest.mark.usefixtures("demo_registry")  # the demo patches (tests/toolkit/conftest.py)

SRT = "sglang/srt"
PROTOCOL = f"{SRT}/protocol.py"
TAG = "cpython-312"


def _site(tmp_path: Path) -> Path:
    site = demo_patches.make_engine_tree(tmp_path / "site")
    demo_patches.write_record(site)
    return site


def plant(site: Path, relpath: str, elsewhere: Path) -> Path:
    """``site/relpath`` (a file or a folder) moved to ``elsewhere`` and a link left in its place, pointing
    there: the same bytes, reached through a link."""
    inside = site / relpath
    elsewhere.mkdir(parents=True, exist_ok=True)
    outside = elsewhere / inside.name
    shutil.move(inside, outside)
    inside.symlink_to(outside, target_is_directory=outside.is_dir())
    return inside


def plant_pycache(site: Path, elsewhere: Path) -> Path:
    """``srt/__pycache__`` a link to a folder outside site-packages holding bytecode of both files."""
    cache = elsewhere / "__pycache__"
    cache.mkdir(parents=True)
    for stem in ("protocol", "serving"):
        (cache / f"{stem}.{TAG}.pyc").write_bytes(b"not ours to delete")
    shutil.rmtree(site / SRT / "__pycache__", ignore_errors=True)
    (site / SRT / "__pycache__").symlink_to(cache, target_is_directory=True)
    return site / SRT / "__pycache__"


def _refused(call, link: Path) -> str:
    with pytest.raises(PatchError) as caught:
        call()
    message = str(caught.value)
    assert f"{link} " in message and "symbolic link" in message, message
    assert "\n" not in message
    return message


def _states(installed) -> dict[str, str]:
    return {row.patch_id: row.state for row in engine.status(installed)}


def _at_first_rename(monkeypatch, site: Path, action) -> None:
    """Run ``action`` once, just before the first engine file is renamed into place (the journal written)."""
    real_replace = fs.replace
    done = []

    def replace(src, dst):
        if not done and str(dst).startswith(str(site / "sglang")):
            done.append(True)
            action()
        return real_replace(src, dst)

    monkeypatch.setattr(fs, "replace", replace)


def _while_transforming(monkeypatch, action) -> None:
    """Run ``action`` once, while the codemods run (after the links present at the start were refused)."""
    import toolkit.engine.transform as transform

    real = transform.transform_or_raise
    done = []

    def transform_or_raise(*args, **kwargs):
        if not done:
            done.append(True)
            action()
        return real(*args, **kwargs)

    monkeypatch.setattr(transform, "transform_or_raise", transform_or_raise)


@pytest.mark.parametrize("when", ["while transforming", "at the first rename"])
def test_a_file_made_a_link_mid_apply_is_refused_and_never_becomes_a_0777_file(when, tmp_path, monkeypatch):
    """The issue's repro: an engine file replaced by a link to a file with the same bytes mid-apply came out
    a regular patched file with mode 0777 (the link's, from lstat), exit 0, status applied."""
    site = _site(tmp_path)
    installed = load_source(site).as_installed()
    release = {p.name: p.read_bytes() for p in (site / SRT).glob("*.py")}
    elsewhere = tmp_path / "elsewhere"
    action = lambda: plant(site, PROTOCOL, elsewhere)  # noqa: E731
    (_while_transforming(monkeypatch, action) if when == "while transforming"
     else _at_first_rename(monkeypatch, site, action))
    message = _refused(lambda: by_id.apply(installed, ["demo"]), site / PROTOCOL)
    assert "nothing" in message  # "nothing was written" / "nothing changed"
    assert (site / PROTOCOL).is_symlink()
    assert (elsewhere / "protocol.py").read_bytes() == release["protocol.py"]  # never written through
    assert stat.S_IMODE((elsewhere / "protocol.py").lstat().st_mode) == 0o644
    assert {p.name: p.read_bytes() for p in (site / SRT).glob("*.py")} == release
    assert set(_states(installed).values()) == {"not applied"}
    assert not StateDir(site, "sglang").manifest_path.exists()
    assert [p for p in site.rglob("*") if p.name.endswith(fs.TEMP_SUFFIX)] == []
    assert [p for p in elsewhere.rglob("*") if p.name.endswith(fs.TEMP_SUFFIX)] == []


@pytest.mark.parametrize("when", ["while transforming", "at the first rename"])
def test_a_folder_swapped_for_a_link_mid_apply_is_not_written_through(when, tmp_path, monkeypatch):
    """srt/ replaced by a link to a copy outside site-packages mid-apply: the files there were patched
    (4 of 4 runs); now the run stops naming the folder, and nothing outside changes (no temp file either)."""
    site = _site(tmp_path)
    installed = load_source(site).as_installed()
    elsewhere = tmp_path / "elsewhere"
    action = lambda: plant(site, SRT, elsewhere)  # noqa: E731
    (_while_transforming(monkeypatch, action) if when == "while transforming"
     else _at_first_rename(monkeypatch, site, action))
    release = {p.name: p.read_bytes() for p in (site / SRT).glob("*.py")}
    _refused(lambda: by_id.apply(installed, ["demo", "second"]), site / SRT)
    assert (site / SRT).is_symlink()
    assert {p.name: p.read_bytes() for p in (elsewhere / "srt").iterdir() if p.is_file()} == release
    assert set(_states(installed).values()) == {"not applied"}


def test_a_file_made_a_link_mid_revert_is_refused_and_the_patch_stays(tmp_path, monkeypatch):
    site = _site(tmp_path)
    installed = load_source(site).as_installed()
    by_id.apply(installed, ["demo", "second"])
    patched = {p.name: p.read_bytes() for p in (site / SRT).glob("*.py")}
    elsewhere = tmp_path / "elsewhere"
    _at_first_rename(monkeypatch, site, lambda: plant(site, PROTOCOL, elsewhere))
    _refused(lambda: engine.revert(installed), site / PROTOCOL)
    assert (site / PROTOCOL).is_symlink() and (elsewhere / "protocol.py").read_bytes() == patched["protocol.py"]
    assert {p.name: p.read_bytes() for p in (site / SRT).glob("*.py")} == patched
    assert set(_states(installed).values()) == {"applied"}


def test_a_symlinked_pycache_is_refused_and_its_target_keeps_its_bytecode(tmp_path):
    """Apply deleted the bytecode inside the link's target, outside site-packages; now apply and revert
    refuse before writing, as for any folder in the package that is a link."""
    site = _site(tmp_path)
    installed = load_source(site).as_installed()
    elsewhere = tmp_path / "elsewhere"
    link = plant_pycache(site, elsewhere)
    before = snapshot(site, elsewhere)
    _refused(lambda: by_id.apply(installed, ["demo"]), link)
    assert snapshot(site, elsewhere) == before
    link.unlink()
    by_id.apply(installed, ["demo"])
    plant_pycache(site, tmp_path / "elsewhere-2")
    _refused(lambda: engine.revert(installed), site / SRT / "__pycache__")
    assert sorted(p.name for p in (tmp_path / "elsewhere-2" / "__pycache__").iterdir()) == [
        f"protocol.{TAG}.pyc", f"serving.{TAG}.pyc"]


def test_a_pycache_made_a_link_mid_apply_is_not_followed(tmp_path, monkeypatch):
    """``__pycache__`` swapped for a link between the renames: the bytecode deletion refuses it, the run
    puts every file back, and the bytecode in the link's target stays."""
    site = _site(tmp_path)
    installed = load_source(site).as_installed()
    release = {p.name: p.read_bytes() for p in (site / SRT).glob("*.py")}
    elsewhere = tmp_path / "elsewhere"
    _at_first_rename(monkeypatch, site, lambda: plant_pycache(site, elsewhere))
    _refused(lambda: by_id.apply(installed, ["demo"]), site / SRT / "__pycache__")
    kept = sorted(p.name for p in (elsewhere / "__pycache__").iterdir())
    assert kept == [f"protocol.{TAG}.pyc", f"serving.{TAG}.pyc"]
    assert {p.name: p.read_bytes() for p in (site / SRT).glob("*.py")} == release
    assert set(_states(installed).values()) == {"not applied"}


def test_a_link_planted_mid_repair_is_refused(tmp_path, monkeypatch):
    from toolkit.engine.repair import repair

    site = _site(tmp_path)
    installed = load_source(site).as_installed()
    by_id.apply(installed, ["demo", "second"])
    patched = (site / PROTOCOL).read_bytes()
    elsewhere = tmp_path / "elsewhere"
    _at_first_rename(monkeypatch, site, lambda: plant(site, PROTOCOL, elsewhere))
    _refused(lambda: repair(installed, lambda dist, version: site), site / PROTOCOL)
    assert (site / PROTOCOL).is_symlink() and (elsewhere / "protocol.py").read_bytes() == patched


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o444, 0o777])
def test_a_backup_is_never_more_open_than_its_release_file(mode, tmp_path):
    """A 0600 release file's backup was 0644 (readable by everyone); now it keeps the file's mode bits,
    never more open than 0644 (a 0777 file's backup is 0644). The patched file keeps the release's mode."""
    site = _site(tmp_path)
    installed = load_source(site).as_installed()
    os.chmod(site / PROTOCOL, mode)
    old_umask = os.umask(0)
    try:
        by_id.apply(installed, ["demo"])
    finally:
        os.umask(old_umask)
    backup = StateDir(site, "sglang").backup_path("srt/protocol.py")
    assert stat.S_IMODE(backup.lstat().st_mode) == mode & 0o644
    assert stat.S_IMODE((site / PROTOCOL).lstat().st_mode) == mode
    engine.revert(installed)
    assert stat.S_IMODE((site / PROTOCOL).lstat().st_mode) == mode
    assert (site / PROTOCOL).read_text() == demo_patches.PROTOCOL
