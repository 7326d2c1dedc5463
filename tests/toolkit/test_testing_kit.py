"""toolkit.testing, the authors' kit: golden snippets (assert_codemod) and conformance on real releases
(assert_conforms), for registered patches and for a patch another distribution would ship."""

from __future__ import annotations

import libcst as cst
import pytest

from tests.harness.fixtures import ensure_source_tree
from tests.toolkit.demo_patches import MissingAnchor, WrapHandle
from toolkit.codemod import AnchoredTransformer, FileEdit, Patch
from toolkit.testing import assert_codemod, assert_conforms, conformance_problems

SGLANG_0_5_23 = ("sglang", "0.5.23")
CHAT = "srt/entrypoints/openai/serving_chat.py"
BEFORE = '''
    class Serving:
        def handle(self, request):
            return {"text": request}
'''


class AddConstant(AnchoredTransformer):
    """What a patch of another distribution might do: one marked line after the module's first import."""

    ANCHORS = {"first-import": "the module's first import"}

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return self.insert_after_first_import(updated_node, "OUTSIDE_PATCHED = True", "first-import")


class MissingInChat(AnchoredTransformer):
    ANCHORS = {"NoSuchServingClass": "a class serving_chat.py does not have"}


def outside(id: str, transformer: type) -> Patch:
    return Patch(id=id, engine="sglang", versions=">=0.5.23,<=0.5.23", files=(FileEdit(CHAT, (transformer,)),),
                 summary="a patch another distribution would register")


@pytest.fixture(scope="module", autouse=True)
def release_cached():
    ensure_source_tree(*SGLANG_0_5_23)  # the test reads the cache, it downloads nothing


def test_assert_codemod_passes_on_the_right_snippet():
    assert_codemod(WrapHandle, BEFORE, '''
        class Serving:
            def handle(self, request):
                request = request  # toolkit:example
                return {"text": request}
    ''', engine="sglang", engine_version="0.5.23")


def test_assert_codemod_fails_with_a_diff_on_a_wrong_snippet():
    with pytest.raises(AssertionError) as failed:
        assert_codemod(WrapHandle, BEFORE, '''
            class Serving:
                def handle(self, request):
                    request = request  # toolkit:other-id
                    return {"text": request}
        ''', engine="sglang", engine_version="0.5.23")
    message = str(failed.value)
    assert "WrapHandle on the snippet did not give the expected text" in message
    assert "-        request = request  # toolkit:other-id" in message
    assert "+        request = request  # toolkit:example" in message


def test_assert_codemod_fails_on_a_missing_anchor():
    with pytest.raises(AssertionError, match=r"anchors not found as declared: Serving.nonexistent "
                                             r"\(a method that is not there\): not found"):
        assert_codemod(MissingAnchor, BEFORE, BEFORE)
    with pytest.raises(AssertionError, match="does not parse"):
        assert_codemod("tests.toolkit.demo_patches:WrapHandle", "def (:", "")


def test_a_real_patch_conforms_on_a_real_release():
    assert_conforms("token-ids", releases=[SGLANG_0_5_23])
    # composed with the other registered patch that supports 0.5.23 (tito edits token-ids' files)
    assert conformance_problems("tito", releases=[SGLANG_0_5_23]) == {"sglang==0.5.23": []}


def test_another_distributions_patch_conforms_and_composes_with_the_registered_ones():
    patch = outside("outside", AddConstant)
    assert conformance_problems(patch, releases=[SGLANG_0_5_23], others=["token-ids", "tito"]) == {"sglang==0.5.23": []}
    assert_conforms(patch)  # its versions declare 0.5.23 only: the default releases


def test_a_patch_whose_anchor_is_missing_fails_naming_the_release():
    with pytest.raises(AssertionError) as failed:
        assert_conforms(outside("missing-anchor", MissingInChat), releases=[SGLANG_0_5_23])
    message = str(failed.value)
    assert "patch missing-anchor does not conform on sglang==0.5.23" in message
    assert f"sglang==0.5.23: {CHAT}: NoSuchServingClass (not found)" in message


def test_no_release_to_check_is_a_failure_not_a_pass():
    lonely = Patch(id="lonely", engine="sglang", versions=">=9,<=9.1", files=(FileEdit(CHAT, (AddConstant,)),),
                   summary="declares no known release")
    with pytest.raises(AssertionError, match="no known release to check it on"):
        assert_conforms(lonely)
    with pytest.raises(AssertionError, match="unknown patch 'no-such-patch'"):
        assert_conforms("no-such-patch")
