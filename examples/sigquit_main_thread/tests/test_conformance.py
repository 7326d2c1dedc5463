"""The patch on the real ``srt/entrypoints/engine.py`` of the release it declares (SGLang 0.5.9), and
the release where upstream fixed it refused as "not needed" (toolkit.testing.assert_conforms; the
releases' files come from serving-toolkit's cache, downloaded there on first use)."""

from __future__ import annotations

import pytest

from sigquit_main_thread.patch import PATCH
from toolkit.releases import releases_of
from toolkit.testing import assert_conforms

RELEASES = releases_of(PATCH.engine, PATCH.versions)


def test_it_declares_sglang_0_5_9_and_is_not_needed_from_0_5_10():
    assert RELEASES == [("sglang", "0.5.9")]
    assert PATCH.not_needed_on("0.5.9") == ""
    assert all(PATCH.not_needed_on(version) for _, version in releases_of("sglang", ">=0.5.10"))


@pytest.mark.parametrize("release", RELEASES, ids=[f"{dist}-{version}" for dist, version in RELEASES])
def test_conforms_on(release):
    assert_conforms(PATCH, releases=[release])


def test_upstream_fix_in_0_5_10_is_why_it_is_not_needed_there():
    """The release that carries the guard itself (the real file has the main-thread check): the patch
    stops at 0.5.9, and its codemod finds nothing to guard there."""
    from toolkit import releases

    from toolkit.testing import anchor_problems

    tree = releases.release_tree("sglang", "0.5.10", ["srt/entrypoints/engine.py"])
    assert b"threading.current_thread() is threading.main_thread()" in tree.read("srt/entrypoints/engine.py")
    # and the codemod recognises the fixed shape: no unguarded statement, so nothing would be written
    _, _, problems = anchor_problems(tree, PATCH)
    assert problems == ["srt/entrypoints/engine.py: sigquit (not found)"]
