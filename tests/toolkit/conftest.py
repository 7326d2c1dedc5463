"""Fixtures shared by the patch-engine tests that run the demo patches on a throwaway engine tree."""

from __future__ import annotations

import pytest

from tests.toolkit import demo_patches
from toolkit import api
from toolkit.engine.sources import load_source


@pytest.fixture
def demo_registry(monkeypatch):
    """The registry holds only the demo patches (``usefixtures`` it in a module that needs them)."""
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [demo_patches.DEMO, demo_patches.SECOND])


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A demo engine tree that the API finds as the installed engine."""
    site = demo_patches.make_engine_tree(tmp_path / "site")
    monkeypatch.setattr(api, "find_engines", lambda python=None: [load_source(site).as_installed()])
    return site
