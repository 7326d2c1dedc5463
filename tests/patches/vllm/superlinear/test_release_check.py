"""Where vLLM's superlinear plugin is proved (plugin.VLLM_RELEASES on CPU, CUDA_VLLM_RELEASES on GPU): a
release outside stops vLLM at plugin load in one sentence, unless TOOLKIT_SUPERLINEAR_ANY_VLLM=1; and
`toolkit list` shows both engines' plugins with those ranges."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.harness.fixtures import REPO_ROOT
from toolkit.patches.common.superlinear.switch import SuperlinearConfigError
from toolkit.patches.vllm.superlinear.plugin import CUDA_VLLM_RELEASES, VLLM_RELEASES, check_release


@pytest.mark.parametrize("version, on_cpu", [
    ("0.24.0", True), ("0.25.1", True), ("0.26.0+cu129", True), ("0.32.0+cpu", True), ("0.33.0", True),
    ("0.29.0.post1", True), ("0.32.0", False), ("0.33.0+cu130", False),
])
def test_a_proved_release_loads(version, on_cpu):
    check_release(version, on_cpu, environ={})


@pytest.mark.parametrize("version, on_cpu, proved", [
    ("0.23.0", True, VLLM_RELEASES), ("0.34.0", True, VLLM_RELEASES), ("0.31.0", False, CUDA_VLLM_RELEASES),
    ("0.26.0+cu129", False, CUDA_VLLM_RELEASES), ("not-a-version", True, VLLM_RELEASES),
])
def test_another_release_is_refused_in_one_sentence_unless_asked_to_try(version, on_cpu, proved):
    with pytest.raises(SuperlinearConfigError) as caught:
        check_release(version, on_cpu, environ={})
    message = str(caught.value)
    assert f"is proved on vLLM {proved}, not on vLLM {version}" in message
    assert "TOOLKIT_SUPERLINEAR_ANY_VLLM=1" in message and "\n" not in message
    check_release(version, on_cpu, environ={"TOOLKIT_SUPERLINEAR_ANY_VLLM": "1"})


def test_toolkit_list_shows_each_engines_plugin_and_its_releases():
    proc = subprocess.run([sys.executable, "-m", "toolkit", "list", "--json"], capture_output=True, text=True,
                          cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    plugins = {p["engine"]: p for p in json.loads(proc.stdout)["plugins"]}
    assert plugins["vllm"]["versions"] == VLLM_RELEASES == ">=0.24,<0.34"
    assert plugins["vllm"]["entry_point"] == "vllm.general_plugins" and CUDA_VLLM_RELEASES in plugins["vllm"]["notes"]
    assert plugins["sglang"]["versions"] == ">=0.5.11,<=0.5.23"
    table = subprocess.run([sys.executable, "-m", "toolkit", "list", "vllm"], capture_output=True, text=True,
                           cwd=REPO_ROOT, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert table.returncode == 0 and "superlinear-plugin" in table.stdout and ">=0.24,<0.34" in table.stdout
