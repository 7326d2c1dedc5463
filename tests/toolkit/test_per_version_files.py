"""A patch whose files differ between releases (``FileEdit(versions=...)``): the declaration errors, which
files each release gets (``Patch.files_for``), and every consumer on two small engine trees through the
real patch engine: apply, status, ``check --source``, the overlap refusal, revert, the kit's golden run and
the matrix digest.

The trees: on 0.5.9 ``Serving.handle`` lives in ``srt/serving.py``; on 0.5.12 it moved to
``srt/handlers.py`` and ``srt/serving.py`` keeps its old copy (as vLLM 0.29 kept
``entrypoints/openai/api_server.py``), so a file picked by "whichever exists" would be the wrong one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.toolkit import demo_patches
from tests.toolkit.demo_patches import AddFieldToResponse, WrapHandle
from toolkit import cli, patch_registry
from toolkit.kit import _matrix as matrix
from toolkit.engine import patching as engine
from toolkit.engine import status as states
from toolkit.engine.check import check_source
from toolkit.declare import FileEdit, Patch
from toolkit.errors import PatchError
from toolkit.engine.sources import load_source
from toolkit.testing import golden_problems
from tests.harness import by_id

OLD, NEW = "0.5.9", "0.5.12"
PROTOCOL, SERVING, HANDLERS = "srt/protocol.py", "srt/serving.py", "srt/handlers.py"

MOVED = Patch(
    id="moved",
    engine="sglang",
    versions=">=0.5.9,<=0.5.23",
    files=(
        FileEdit(PROTOCOL, (AddFieldToResponse,)),  # every release
        FileEdit(SERVING, (WrapHandle,), versions="<0.5.12"),
        FileEdit(HANDLERS, (WrapHandle,), versions=">=0.5.12"),
    ),
    summary="wraps a handler that moved to another file in 0.5.12",
)
# edits Serving.handle in srt/serving.py on every release, with no after= to order it against MOVED
SAME_FUNCTION = Patch(id="same-function", engine="sglang", versions=">=0.5.9,<=0.5.23",
                      files=(FileEdit(SERVING, (WrapHandle,)),), summary="edits the old handler's file")


def make_tree(root: Path, version: str) -> Path:
    site = demo_patches.make_engine_tree(root, version=version)
    if version == NEW:
        (site / "sglang" / HANDLERS).write_text(demo_patches.SERVING)
    return site


def read_all(site: Path) -> dict[str, bytes]:
    package = site / "sglang"
    return {str(p.relative_to(package)): p.read_bytes() for p in sorted(package.rglob("*.py"))}


def catalog(*patches: Patch):
    return patch_registry.catalog("sglang", list(patches))


# ---- the declaration


def declare(versions) -> Patch:
    return Patch(id="p", engine="sglang", versions=">=0.5.9,<=0.5.23", summary="",
                 files=(FileEdit("srt/x.py", (WrapHandle,), versions=versions),))


@pytest.mark.parametrize("versions,words", [
    ("0.5.12", "is not a PEP 440 range"),
    (">=banana", "is not a PEP 440 range"),
    (12, "is not a PEP 440 range"),
    ("<0.5.9", "lies wholly outside the patch's versions '>=0.5.9,<=0.5.23'"),
    (">0.5.23", "lies wholly outside"),
    ("==0.6.*", "lies wholly outside"),
    (">=0.5.20,<0.5.10", "lies wholly outside"),  # empty in itself
])
def test_a_bad_file_range_is_a_declaration_error(versions, words):
    with pytest.raises(ValueError) as info:
        declare(versions)
    message = str(info.value)
    assert message.startswith("patch p: srt/x.py: versions ") and words in message
    assert message.count(". ") == 0 and "\n" not in message  # one sentence


@pytest.mark.parametrize("versions", [None, "<=0.5.9", ">=0.5.23", "<0.5.12", ">=0.5.12", ">0.5.22.9", "!=0.5.10"])
def test_a_range_that_meets_the_patch_is_accepted(versions):
    assert declare(versions).files[0].versions == versions


def test_a_file_declared_twice_is_a_declaration_error():
    with pytest.raises(ValueError, match=r"^patch p: srt/x.py has more than one FileEdit; declare each file once"):
        Patch(id="p", engine="sglang", versions=">=0.5.9,<=0.5.23", summary="",
              files=(FileEdit("srt/x.py", (WrapHandle,), versions="<0.5.12"),
                     FileEdit("srt/x.py", (WrapHandle,), versions=">=0.5.12")))


@pytest.mark.parametrize("version,files", [
    (OLD, [PROTOCOL, SERVING]),
    ("0.5.11", [PROTOCOL, SERVING]),
    (NEW, [PROTOCOL, HANDLERS]),
    ("0.5.12+cu129", [PROTOCOL, HANDLERS]),  # a local build of 0.5.12
    ("0.5.11.post1", [PROTOCOL, SERVING]),  # 0.5.11 repackaged
    ("0.5.12rc1", [PROTOCOL, HANDLERS]),  # a candidate counts as the release it leads to
    ("0.5.12.dev3+g1a2b3c", [PROTOCOL, HANDLERS]),
    # outside the patch's versions (--allow-unknown-version): the same rule, and open ranges cover it
    ("0.5.5", [PROTOCOL, SERVING]),
    ("0.6.0", [PROTOCOL, HANDLERS]),
    ("not-a-version", [PROTOCOL]),  # in no range: only the files every release edits
])
def test_files_for_a_version(version, files):
    assert [edit.relpath for edit in MOVED.files_for(version)] == files
    assert MOVED.relpaths == (PROTOCOL, SERVING, HANDLERS)


# ---- through the patch engine, on each release


@pytest.mark.parametrize("version,edited,untouched", [(OLD, [PROTOCOL, SERVING], [HANDLERS]),
                                                      (NEW, [HANDLERS, PROTOCOL], [SERVING])])
def test_apply_status_check_revert_on_each_release(tmp_path, monkeypatch, version, edited, untouched):
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [MOVED])
    site = make_tree(tmp_path / "site", version)
    installed = load_source(site).as_installed()
    pristine = read_all(site)

    # check --source: the release's files only, every anchor found
    (checked,) = check_source(load_source(site))
    assert checked.ok and checked.supported and checked.errors == []
    assert sorted({a.relpath for a in checked.anchors}) == sorted(edited)

    result = by_id.apply(installed, ["moved"], catalog=catalog(MOVED))
    assert result.changed_files == sorted(edited)
    after = read_all(site)
    for relpath in edited:
        assert b"# toolkit:moved" in after[relpath]
    for relpath in untouched:  # on this release it is not the patch's file: never written
        assert after.get(relpath) == pristine.get(relpath)

    (row,) = engine.status(installed, catalog=catalog(MOVED))
    assert row.state == states.APPLIED and row.files == {relpath: "patched" for relpath in edited}
    assert not by_id.apply(installed, ["moved"], catalog=catalog(MOVED)).changed_files  # nothing to do

    engine.revert(installed, catalog=catalog(MOVED))
    assert read_all(site) == pristine
    assert [p.name for p in (site / ".toolkit-state" / "sglang").iterdir()] == ["lock"]
    (row,) = engine.status(installed, catalog=catalog(MOVED))
    assert row.state == states.NOT_APPLIED


def test_status_without_a_manifest_reads_the_markers_of_the_releases_files(tmp_path):
    site = make_tree(tmp_path / "site", NEW)
    installed = load_source(site).as_installed()
    by_id.apply(installed, ["moved"], catalog=catalog(MOVED))
    (site / ".toolkit-state" / "sglang" / "manifest.json").unlink()
    (row,) = engine.status(installed, catalog=catalog(MOVED))
    assert row.state == states.NO_MANIFEST and row.files == {PROTOCOL: "patched", HANDLERS: "patched"}


def test_two_patches_on_one_function_are_refused_only_where_both_edit_its_file(tmp_path):
    both = catalog(MOVED, SAME_FUNCTION)
    old = load_source(make_tree(tmp_path / "old", OLD)).as_installed()
    with pytest.raises(PatchError, match=r"patches moved and same-function both edit Serving.handle in srt/serving.py"):
        by_id.apply(old, ["moved", "same-function"], catalog=both)
    new = load_source(make_tree(tmp_path / "new", NEW)).as_installed()
    result = by_id.apply(new, ["moved", "same-function"], catalog=both)  # moved edits srt/handlers.py there
    assert result.changed_files == [HANDLERS, PROTOCOL, SERVING]


# ---- the kit: golden run and matrix, per release


def test_golden_and_matrix_read_each_releases_files(tmp_path):
    trees = {version: load_source(make_tree(tmp_path / version, version)) for version in (OLD, NEW)}
    for version, tree in trees.items():
        assert golden_problems(tree, MOVED, tmp_path / f"golden-{version}", catalog=catalog(MOVED)) == []
        (cell,) = matrix.evaluate(tree, [MOVED], catalog=catalog(MOVED))
        assert cell.ok and cell.declared and cell.anchors_found == cell.anchors_total == 2, cell  # one per file

    def digest(tree, relpaths):
        outer = hashlib.sha256()
        for relpath in relpaths:
            outer.update(f"{relpath}\0{hashlib.sha256(tree.read(relpath)).hexdigest()}\n".encode())
        return outer.hexdigest()

    assert matrix.files_digest(trees[OLD], MOVED) == digest(trees[OLD], [PROTOCOL, SERVING])
    assert matrix.files_digest(trees[NEW], MOVED) == digest(trees[NEW], [PROTOCOL, HANDLERS])
    # a file the patch does not edit on a release does not split that release's group
    other = make_tree(tmp_path / "other", NEW)
    (other / "sglang" / SERVING).write_text("from .handlers import Serving\n")
    assert matrix.files_digest(load_source(other), MOVED) == matrix.files_digest(trees[NEW], MOVED)


def test_list_shows_every_file_and_each_range(monkeypatch, capsys):
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [MOVED])
    assert cli.main(["list", "--json"]) == 0
    (listed,) = json.loads(capsys.readouterr().out)["patches"]
    assert listed["files"] == [PROTOCOL, SERVING, HANDLERS]
    assert listed["file_edits"] == [{"relpath": PROTOCOL, "versions": None},
                                    {"relpath": SERVING, "versions": "<0.5.12"},
                                    {"relpath": HANDLERS, "versions": ">=0.5.12"}]
