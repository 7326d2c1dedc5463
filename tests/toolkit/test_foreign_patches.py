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
from toolkit import engine, patch_registry
from toolkit.errors import PatchError
from toolkit.sources import load_source
from toolkit.version import __version__

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
        engine.apply(installed, ["their-fix"])
    assert str(refused.value) == (
        f"{sys.executable} cannot import the runtime of patch their-fix (their_fix_pkg), which the patched sglang "
        "would import at start-up; install the package that ships it there first; nothing was written")
    assert _digest(installed) == before


def test_their_runtime_present_needs_no_serving_toolkit_there(tmp_path, monkeypatch):
    present = dataclasses.replace(FOREIGN, runtime_modules=("json.decoder",))  # importable everywhere
    monkeypatch.setattr(patch_registry, "registry", lambda: [present])
    installed = _probed(tmp_path, "")  # that interpreter has no serving-toolkit
    assert engine.apply(installed, ["their-fix"]).changed_files == ["srt/serving.py"]
    engine.revert(installed)
