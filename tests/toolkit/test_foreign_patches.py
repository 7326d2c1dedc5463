"""Another distribution's patch applied into another interpreter's engine (``--python ENV``): its own
runtime package must be importable there, or nothing is written (the patched engine would otherwise
start as the release, its patch silently off). Ours need serving-toolkit there; theirs do not."""

from __future__ import annotations

import dataclasses
import hashlib
import sys
from pathlib import Path

import pytest

from tests.toolkit import demo_patches
from toolkit import patch_registry
from toolkit.engine import patching as engine
from toolkit.engine import status as states
from toolkit.errors import PatchError
from toolkit.engine.sources import load_source
from toolkit.base.version import __version__
from tests.harness import by_id

FOREIGN = dataclasses.replace(demo_patches.SECOND, id="their-fix", runtime_modules=("their_fix_pkg.runtime",))


def _probed(tmp_path: Path, toolkit_version: str):
    """The demo engine as `--python` finds it: probed, so its toolkit version is known."""
    installed = load_source(demo_patches.make_engine_tree(tmp_path / "site")).as_installed()
    return dataclasses.replace(installed, python=sys.executable, toolkit_version=toolkit_version)


def _digest(installed) -> str:
    return hashlib.sha256((Path(installed.package_dir) / "srt" / "serving.py").read_bytes()).hexdigest()


def test_their_runtime_missing_there_is_refused_before_writing(tmp_path, monkeypatch):
    monkeypatch.setattr(patch_registry, "registry", lambda: [FOREIGN])
    installed = _probed(tmp_path, __version__)
    before = _digest(installed)
    with pytest.raises(PatchError) as refused:
        by_id.apply(installed, ["their-fix"])
    assert str(refused.value) == (
        f"{sys.executable} cannot import the runtime of patch their-fix (their_fix_pkg), which the patched sglang "
        "would import at start-up; install the package that ships it there first; nothing was written")
    assert _digest(installed) == before


def test_their_runtime_present_needs_no_serving_toolkit_there(tmp_path, monkeypatch):
    present = dataclasses.replace(FOREIGN, runtime_modules=("json.decoder",))  # importable everywhere
    monkeypatch.setattr(patch_registry, "registry", lambda: [present])
    installed = _probed(tmp_path, "")  # that interpreter has no serving-toolkit
    assert by_id.apply(installed, ["their-fix"]).changed_files == ["srt/serving.py"]
    engine.revert(installed)


def test_a_patch_whose_package_is_gone_stays_in_status_and_revert_restores_the_release(tmp_path, monkeypatch):
    """Their package uninstalled while its patch is applied: `status` names it (drifted, with the
    revert that fixes it) instead of leaving it out, apply-patch refuses in one sentence, and `revert`
    still restores the release's bytes from the backups."""
    here = dataclasses.replace(FOREIGN, runtime_modules=())
    monkeypatch.setattr(patch_registry, "registry", lambda: [demo_patches.DEMO, here])
    installed = load_source(demo_patches.make_engine_tree(tmp_path / "site")).as_installed()
    before = _digest(installed)
    engine.apply(installed)
    monkeypatch.setattr(patch_registry, "registry", lambda: [demo_patches.DEMO])  # `pip uninstall` of theirs
    rows = {row.patch_id: row for row in engine.status(installed)}
    assert rows["demo"].state == states.APPLIED
    gone = rows["their-fix"]
    assert (gone.state, gone.supported, gone.files) == (states.DRIFTED, False, {"srt/serving.py": "patched"})
    assert "no installed package registers their-fix now" in gone.detail and "toolkit revert sglang" in gone.detail
    with pytest.raises(PatchError, match="does not know: their-fix .*a patch package since uninstalled"):
        by_id.apply(installed, ["demo"])
    engine.revert(installed)
    assert _digest(installed) == before
    assert [row.state for row in engine.status(installed)] == [states.NOT_APPLIED]


def test_status_judges_their_runtime_by_their_package_not_by_serving_toolkit(tmp_path, monkeypatch):
    """`status --python ENV`: another package's applied patch is `applied` where its own package is
    importable, even without serving-toolkit there, and `runtime missing` where its package is not."""
    present = dataclasses.replace(FOREIGN, runtime_modules=("json.decoder",))
    monkeypatch.setattr(patch_registry, "registry", lambda: [present])
    installed = _probed(tmp_path, "")  # that interpreter has no serving-toolkit
    by_id.apply(installed, ["their-fix"])
    assert [row.state for row in engine.status(installed)] == [states.APPLIED]
    monkeypatch.setattr(patch_registry, "registry", lambda: [FOREIGN])  # its package is their_fix_pkg
    (row,) = engine.status(installed)
    assert row.state == states.RUNTIME_MISSING
    assert row.detail.startswith(f"{sys.executable} cannot import their_fix_pkg, the runtime of their-fix")
    assert f"toolkit revert sglang --python {sys.executable}" in row.detail
    engine.revert(installed)
