"""SGLang's own tests for scripts/engine_own_tests.py (scripts/support/sglang_tests.py): the vendored upstream
files match their PINNED.json, a changed or stray file is refused, the copy a run uses is laid out apart
from this repository, and the SGLang patch declarations choose the vendored files. No engine venv."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from toolkit.kit import _own_tests_compare as otc
from toolkit.kit import _own_tests_select as ots
from scripts.support import sglang_tests as st
from toolkit.patch_registry import catalog

VERSION = "0.5.23"


def test_the_vendored_files_match_pinned_json():
    pin = st.check(VERSION)
    assert pin["repo"] == "sgl-project/sglang" and pin["release"] == VERSION
    assert len(pin["files"]) >= 4
    for entry in pin["files"]:
        assert len(entry["commit"]) == 40 and int(entry["commit"], 16) >= 0  # a full commit id
        assert entry["path"].startswith(st.TESTS_DIR + "/")


@pytest.fixture
def vendored_copy(tmp_path, monkeypatch) -> Path:
    """A copy of the vendored folder that a test may change; sglang_tests reads it in place of the real one."""
    monkeypatch.setattr(st, "UPSTREAM", tmp_path / "upstream")
    shutil.copytree(st.REPO_ROOT / "tests" / "upstream" / f"sglang-{VERSION}", st.folder(VERSION))
    return st.folder(VERSION)


def test_a_changed_or_missing_file_is_refused(vendored_copy):
    first = json.loads((vendored_copy / "PINNED.json").read_text())["files"][0]["path"]
    with open(vendored_copy / first, "a") as handle:
        handle.write("\n# changed\n")
    with pytest.raises(st.BadPin, match="differs from PINNED.json"):
        st.check(VERSION)
    st.record(VERSION)  # a refresh by hand: the new bytes recorded
    assert st.check(VERSION)
    (vendored_copy / first).unlink()
    with pytest.raises(st.BadPin, match="is missing"):
        st.check(VERSION)
    with pytest.raises(st.BadPin, match="no vendored SGLang tests for 0.0.1"):
        st.check("0.0.1")


def test_a_stray_test_file_is_refused(vendored_copy):
    (vendored_copy / "test" / "test_stray.py").write_text("")
    with pytest.raises(st.BadPin, match="test_stray.py .* is not in PINNED.json"):
        st.check(VERSION)


def test_the_run_copy_has_its_own_pytest_ini_and_follows_pinned_json(vendored_copy, tmp_path):
    root = st.fetch(VERSION, tmp_path / "cache")
    assert (root / "pytest.ini").read_text() == "[pytest]\n"  # pytest's rootdir: never this repository
    pinned = {entry["path"] for entry in st.pinned(VERSION)["files"]}
    assert {p.relative_to(root).as_posix() for p in root.rglob("*.py")} == pinned
    first = sorted(pinned)[0]
    (vendored_copy / first).write_text("# refreshed\n")
    st.record(VERSION)
    assert (st.fetch(VERSION, tmp_path / "cache") / first).read_text() == "# refreshed\n"  # rebuilt


def test_the_sglang_patch_declarations_choose_the_vendored_files(tmp_path):
    """The modules our SGLang patches edit on 0.5.23 (their declarations) pick every vendored file: each
    imports protocol.py or serving_chat.py. The engine's files are stand-ins: only their names matter."""
    relpaths = {edit.relpath for p in catalog("sglang").patches if p.supports(VERSION) for edit in p.files_for(VERSION)}
    assert "srt/entrypoints/openai/protocol.py" in relpaths and "srt/entrypoints/openai/serving_chat.py" in relpaths
    engine = tmp_path / "sglang"
    for rel in relpaths:
        (engine / rel).parent.mkdir(parents=True, exist_ok=True)
        (engine / rel).write_text("class ChatCompletionRequest:\n    pass\n")
    targets = [ots.make_target(engine, "sglang", rel) for rel in sorted(relpaths)]
    root = st.REPO_ROOT / "tests" / "upstream" / f"sglang-{VERSION}"
    chosen = ots.select_test_files(root, targets, tests_dir=st.TESTS_DIR)
    assert sorted(chosen.files) == sorted(entry["path"] for entry in st.pinned(VERSION)["files"])
    assert chosen.files["test/registered/openai_server/basic/test_serving_chat.py"] == [
        "sglang.srt.entrypoints.openai.protocol", "sglang.srt.entrypoints.openai.serving_chat"]
    assert chosen.notes == {}  # none of them launches a server


def test_the_server_plugin_refuses_sglang_servers():
    namespace: dict = {}
    exec(compile(ots.SERVER_PLUGIN, "own_tests_no_server.py", "exec"), namespace)
    with pytest.raises(RuntimeError, match="engine server not started"):
        namespace["_refuse"]("model", "http://127.0.0.1:1")
    assert ("sglang.test.test_utils", ("popen_launch_server",)) in ots.SERVER_STARTERS
    assert ots.select_test_files.__defaults__[-1] == "tests"  # vLLM's sdist layout stays the default


def test_failures_of_tests_older_than_the_release_are_grouped_so():
    older = "test older than the release"
    assert otc.reason_group("AttributeError: '_MockTokenizerManager' object has no attribute 'config_value'") == older
    assert otc.reason_group("ValueError: config namespace 'serving' not published") == older
    assert otc.reason_group("AttributeError: 'Mock' object has no attribute 'x'") == "other"
