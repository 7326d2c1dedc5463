"""The patch on the real ``srt/disaggregation/decode.py`` of every release it declares: anchors, apply,
compile, marker, idempotent apply, status, byte-identical revert, and composition with every other
registered SGLang patch that edits the file (toolkit.testing.assert_conforms). The releases' files
come from serving-toolkit's cache, downloaded there on first use."""

from __future__ import annotations

import pytest

from decode_drain_transferred.patch import PATCH
from toolkit.releases import releases_of
from toolkit.testing import assert_conforms

RELEASES = releases_of(PATCH.engine, PATCH.versions)


def test_it_declares_every_known_sglang_release_from_0_5_9_to_0_5_23():
    assert len(RELEASES) == 19 and RELEASES[0] == ("sglang", "0.5.9") and RELEASES[-1] == ("sglang", "0.5.23")


@pytest.mark.parametrize("release", RELEASES, ids=[f"{dist}-{version}" for dist, version in RELEASES])
def test_conforms_on(release):
    assert_conforms(PATCH, releases=[release])
