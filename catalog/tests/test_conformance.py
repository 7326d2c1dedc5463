"""Every fix of the catalog on the real files of every release it declares: anchors, apply, compile,
marker, idempotent apply, status, byte-identical revert, and composition with every other registered
patch of the engine that edits one of its files, in both orders (toolkit.testing.assert_conforms).
The releases' files come from serving-toolkit's cache (the slim trees), downloaded there on first use."""

from __future__ import annotations

import pytest

import toolkit_catalog
from toolkit.releases import releases_of
from toolkit.testing import assert_conforms

CASES = [(patch, release) for patch in toolkit_catalog.patches()
         for release in releases_of(patch.engine, patch.versions)]


def test_every_fix_declares_at_least_one_known_release():
    assert {p.id for p in toolkit_catalog.patches()} == {p.id for p, _ in CASES}


@pytest.mark.parametrize(("patch", "release"), CASES, ids=[f"{p.id}-{d}-{v}" for p, (d, v) in CASES])
def test_conforms_on(patch, release):
    assert_conforms(patch, releases=[release])
