"""verify/server_launch.py: the environment a server is started with (no engine needed)."""

from __future__ import annotations

from toolkit.verify.server_launch import server_env


def test_caches_are_the_servers_own_but_a_kept_inductor_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("HF_HOME", "/somewhere/else")
    env = server_env("vllm", tmp_path, {}, cpu=True)
    for name, sub in (("TMPDIR", "tmp"), ("HF_HOME", "hf-home"), ("VLLM_CACHE_ROOT", "vllm-cache"),
                      ("TORCHINDUCTOR_CACHE_DIR", "inductor-cache")):
        assert env[name] == str(tmp_path / sub) and (tmp_path / sub).is_dir(), name
    assert env["VLLM_TARGET_DEVICE"] == "cpu" and env["HF_HUB_OFFLINE"] == "1"

    kept = tmp_path / "kept-inductor"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(kept))  # the caller keeps torch.compile's cache
    assert server_env("sglang", tmp_path, {}, cpu=True)["TORCHINDUCTOR_CACHE_DIR"] == str(kept)
    # what the caller passes for this server still wins
    assert server_env("vllm", tmp_path, {"TORCHINDUCTOR_CACHE_DIR": "/x"}, cpu=True)["TORCHINDUCTOR_CACHE_DIR"] == "/x"
