"""The family bodies of scripts/make_family_model.py: each is its architecture's own transformers class at a tiny
size, loads and generates with transformers, and is built byte for byte the same every time. Server-less: the
engines serving them are the sweeps' and the verifier's tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.support.load import load_script
from tests.harness.fixtures import ensure_family_model

builder = load_script("make_family_model.py", "_toolkit_make_family_model")


@pytest.mark.parametrize("family", sorted(builder.FAMILIES))
def test_each_family_is_its_architecture_at_a_tiny_size_and_generates(family: str):
    model_dir = Path(ensure_family_model(family))
    config = json.loads((model_dir / "config.json").read_text())
    spec = builder.FAMILIES[family]
    assert config["architectures"] == [spec.architecture]
    assert config["head_dim"] >= 32 and config["hidden_size"] == 64  # vLLM's CPU attention needs head_dim >= 32
    assert config["num_hidden_layers"] == 2
    if family in ("gemma3", "gpt-oss"):  # a sliding-window layer and a full-attention one
        assert config["layer_types"] == ["sliding_attention", "full_attention"]
        assert config["sliding_window"] == builder.SLIDING_WINDOW
    if family == "qwen3-moe":
        assert (config["num_experts"], config["num_experts_per_tok"]) == (4, 2)
    meta = json.loads((model_dir / "family.json").read_text())
    assert meta["family"] == family and meta["vllm_args"] == list(spec.vllm_args)
    assert builder.check(model_dir).startswith(f"ok: {family} ({spec.architecture})")


def test_gemma3_has_its_sandwich_norms_and_qwen3_moe_its_experts():
    from safetensors import safe_open

    def names(family: str) -> set[str]:
        with safe_open(str(Path(ensure_family_model(family)) / "model.safetensors"), "np") as f:
            return set(f.keys())

    gemma = names("gemma3")
    for norm in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                 "post_feedforward_layernorm", "self_attn.q_norm", "self_attn.k_norm"):
        assert f"model.layers.1.{norm}.weight" in gemma, norm
    moe = names("qwen3-moe")
    assert {f"model.layers.0.mlp.experts.{i}.down_proj.weight" for i in range(4)} <= moe
    assert "model.layers.0.mlp.gate.weight" in moe


def test_the_weights_are_the_same_bytes_on_every_build(tmp_path: Path):
    cached = Path(ensure_family_model("mistral"))
    builder.build(tmp_path / "again", builder.FAMILIES["mistral"])
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (tmp_path / "again" / name).read_bytes() == (cached / name).read_bytes(), name
    # and each family's weights are its own (Llama and Mistral have the same shapes and names)
    assert (Path(ensure_family_model("llama")) / "model.safetensors").read_bytes() != \
        (cached / "model.safetensors").read_bytes()
