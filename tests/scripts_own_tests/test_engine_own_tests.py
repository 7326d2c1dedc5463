"""The pure parts of scripts/engine_own_tests.py (scripts/support/own_tests.py): which upstream test files
the patch declarations choose, the per-test outcomes of a junit report, and the release-vs-patched
verdict. No engine venv, no network: the engine tree and its tests are written here."""

from __future__ import annotations

from pathlib import Path

from toolkit.kit import _own_tests_compare as otc
from toolkit.kit import _own_tests_select as ots
from toolkit.patch_registry import catalog


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_the_modules_come_from_the_patch_declarations():
    relpaths = {edit.relpath for p in catalog("vllm").patches if p.supports("0.32.0") for edit in p.files_for("0.32.0")}
    modules = {ots.module_of("vllm", rel) for rel in relpaths}
    assert "vllm.v1.core.kv_cache_utils" in modules
    assert "vllm.entrypoints.openai.chat_completion.serving" in modules
    assert ots.module_of("vllm", "entrypoints/openai/__init__.py") == "vllm.entrypoints.openai"


def engine_and_tests(tmp_path: Path) -> tuple[Path, list[ots.Target]]:
    engine = tmp_path / "engine" / "vllm"
    write(engine / "__init__.py", "")
    write(engine / "v1" / "__init__.py", "")
    write(engine / "v1" / "core" / "__init__.py", "from .kv_cache_utils import hash_block\n")
    write(engine / "v1" / "core" / "kv_cache_utils.py",
          "def hash_block(x):\n    return x\n\ndef _private():\n    pass\n\nNONE_HASH: bytes = b''\n")
    write(engine / "v1" / "core" / "other.py", "def unrelated():\n    pass\n")
    tests = tmp_path / "sdist" / "tests"
    write(tests / "test_direct.py", "from vllm.v1.core.kv_cache_utils import hash_block\n")
    write(tests / "sub" / "test_module_from_parent.py", "from vllm.v1.core import kv_cache_utils\n")
    write(tests / "sub" / "test_reexport.py", "def test():\n    from vllm.v1.core import hash_block\n")
    write(tests / "sub" / "test_plain_import.py", "import vllm.v1.core.kv_cache_utils as k\n")
    write(tests / "test_mock_string.py", "from unittest import mock\n"
                                         "P = mock.patch('vllm.v1.core.kv_cache_utils.hash_block')\n")
    write(tests / "test_unrelated.py", "from vllm.v1.core.other import unrelated\nfrom vllm.v1 import core\n")
    write(tests / "test_not_reexported.py", "from vllm.v1.core import NONE_HASH\n")  # __init__ does not export it
    write(tests / "test_server.py", "from tests.utils import RemoteOpenAIServer\n"
                                    "from vllm.v1.core.kv_cache_utils import hash_block\n")
    write(tests / "helpers.py", "from vllm.v1.core.kv_cache_utils import hash_block\n")  # not a test file
    return tmp_path / "sdist", [ots.make_target(engine, "vllm", "v1/core/kv_cache_utils.py")]


def test_test_files_are_those_importing_an_edited_module(tmp_path):
    root, targets = engine_and_tests(tmp_path)
    assert targets[0].names == {"hash_block", "NONE_HASH"}
    chosen = ots.select_test_files(root, targets)
    assert sorted(chosen.files) == ["tests/sub/test_module_from_parent.py", "tests/sub/test_plain_import.py",
                                    "tests/sub/test_reexport.py", "tests/test_direct.py",
                                    "tests/test_mock_string.py", "tests/test_server.py"]
    assert list(chosen.notes) == ["tests/test_server.py"]  # run, with its server refused: and said so
    assert sorted(ots.select_test_files(root, targets, under=["tests/sub"]).files) == [
        "tests/sub/test_module_from_parent.py", "tests/sub/test_plain_import.py", "tests/sub/test_reexport.py"]
    assert list(ots.select_test_files(root, targets, under=["tests/test_direct.py"]).files) == ["tests/test_direct.py"]
    assert ots.select_test_files(root, targets, with_servers=True).notes == {}


JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.a.test_b" name="test_ok" file="tests/a/test_b.py" line="3" time="0.1"/>
<testcase classname="tests.a.test_b.TestC" name="test_param[x-1]" file="tests/a/test_b.py" line="9" time="0.1">
  <failure message="AssertionError: assert 1 == 2&#10;second line">trace</failure></testcase>
<testcase classname="tests.a.test_b" name="test_setup" file="tests/a/test_b.py" line="20" time="0.1">
  <error message="failed on setup with &quot;OSError: We couldn't connect to 'https://huggingface.co'&quot;">x</error>
</testcase>
<testcase classname="tests.a.test_b" name="test_skip" file="tests/a/test_b.py" line="30" time="0">
  <skipped type="pytest.skip" message="CUDA is not available">s</skipped></testcase>
<testcase classname="tests.a.test_b" name="test_teardown" file="tests/a/test_b.py" line="40" time="0.1"/>
<testcase classname="tests.a.test_b" name="test_teardown" file="tests/a/test_b.py" line="40" time="0.1">
  <error message="failed on teardown with &quot;RuntimeError: leak&quot;">t</error></testcase>
</testsuite></testsuites>"""


def test_junit_outcomes_per_node_id():
    outcomes = otc.parse_junit(JUNIT)
    assert outcomes == {
        "tests/a/test_b.py::test_ok": otc.Outcome("passed"),
        "tests/a/test_b.py::TestC::test_param[x-1]": otc.Outcome("failed", "AssertionError: assert 1 == 2"),
        "tests/a/test_b.py::test_setup": otc.Outcome(
            "error", "failed on setup with \"OSError: We couldn't connect to 'https://huggingface.co'\""),
        "tests/a/test_b.py::test_skip": otc.Outcome("skipped", "CUDA is not available"),
        "tests/a/test_b.py::test_teardown": otc.Outcome("error", "failed on teardown with \"RuntimeError: leak\""),
    }


def out(outcome: str, reason: str = "") -> otc.Outcome:
    return otc.Outcome(outcome, reason)


def test_a_test_passing_only_on_the_release_is_a_regression_when_the_rerun_agrees():
    release = {"t::same": out("passed"), "t::broken": out("passed"), "t::flaky": out("passed"),
               "t::hub": out("error", "OSError: We couldn't connect to huggingface.co"),
               "t::cuda": out("failed", "RuntimeError: Torch not compiled with CUDA enabled"),
               "t::fixed": out("failed", "AssertionError"), "t::gone": out("passed"),
               "t::config": otc.Outcome("error", "pydantic_core._pydantic_core.ValidationError: 1 validation error",
                                       "ValidationError: 1 validation error for ModelConfig\n  Value error, Invalid "
                                       "repository ID or local directory specified: 'Qwen/Qwen3-0.6B'.")}
    patched = {"t::same": out("passed"), "t::broken": out("failed", "AssertionError: broken"),
               "t::flaky": out("failed", "AssertionError"), "t::hub": out("error", "OSError"),
               "t::cuda": out("failed", "x"), "t::fixed": out("passed"), "t::config": out("error")}
    rerun_release = {"t::broken": out("passed"), "t::flaky": out("passed"), "t::fixed": out("failed")}
    rerun_patched = {"t::broken": out("failed"), "t::flaky": out("passed"), "t::fixed": out("passed")}
    result = otc.compare(release, patched, rerun_release, rerun_patched)
    assert result.regressions == ["t::broken", "t::gone"]  # gone: its file no longer collects patched
    assert result.fixed == ["t::fixed"]
    assert list(result.flaky) == ["t::flaky"] and "patched rerun" in result.flaky["t::flaky"]
    assert result.only_in_one == ["t::gone"]
    assert {group: [t for t, _ in tests] for group, tests in otc.grouped(result.failing_both).items()} == {
        "hub download (Qwen/Qwen3-0.6B)": ["t::config"], "hub download": ["t::hub"],  # a config the hub would give
        "CUDA": ["t::cuda"]}
    # without a rerun every difference counts; a release that fails its own rerun is flaky, not ours
    assert otc.compare(release, patched).regressions == ["t::broken", "t::flaky", "t::gone"]
    assert "release's rerun" in otc.compare(release, patched, {"t::broken": out("failed"), "t::flaky": out("passed")},
                                           rerun_patched).flaky["t::broken"]


def test_a_refused_server_is_its_own_group():
    assert otc.reason_group(f"RuntimeError: {ots.NO_SERVER}") == "engine server (not started)"
    assert otc.reason_group("ModuleNotFoundError: No module named 'sgl_kernel'") == "missing module"
    assert otc.reason_group("AssertionError: 1 != 2") == "other"
