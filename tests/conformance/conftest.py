"""Conformance runs hundreds of applies, reverts and statuses per test, each a command: the patch
registry is read once per test, as a command reads it at its edge (reading the entry points is not
what these tests check; tests/toolkit/test_registry.py checks that)."""

from __future__ import annotations

import pytest

from toolkit import patch_registry


@pytest.fixture(autouse=True)
def registry_read_once(monkeypatch):
    known = patch_registry.registry()
    monkeypatch.setattr(patch_registry, "registry", lambda: list(known))
