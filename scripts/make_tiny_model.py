#!/usr/bin/env python3
"""Write a tiny random-weight Llama model with a ChatML + tools tokenizer, with no model hub.

    python scripts/make_tiny_model.py OUT_DIR [--max-position-embeddings N]
    python scripts/make_tiny_model.py --cached [--max-position-embeddings N]   prints the model dir
    python scripts/make_tiny_model.py --check DIR                               load it with transformers

The model: LlamaForCausalLM, hidden 64, 2 layers, 4 heads, 2 KV heads, head_dim 32 (vLLM's CPU
attention needs >= 32), vocab 4096, float32 safetensors, weights from a fixed seed. The tokenizer: a
byte-level BPE trained with the ``tokenizers`` library on a fixed, sorted subset of the standard
library's .py files, loaded by transformers as a ``PreTrainedTokenizerFast``; special tokens
``<|begin_of_text|>`` (bos), ``<|endoftext|>`` (pad), ``<|im_start|>``, ``<|im_end|>`` (eos); the markers
``<tool_call>``, ``</tool_call>``, ``<think>``, ``</think>`` are NON-special added tokens (tool and
reasoning parsers look them up in the vocab, and special tokens vanish from decoded text). The chat
template is ChatML with Hermes/Qwen-style tools. Output is byte-for-byte deterministic.

Building needs only numpy, tokenizers and safetensors (every venv of the project has them); every
file is written by hand so the bytes do not depend on the transformers version. ``--check`` needs
transformers and torch. ``--cached`` builds into ``<cache>/models/tiny-llama-<hash of this script>/``
(``<cache>`` is ``$TOOLKIT_CACHE_DIR``, default ``~/.cache/toolkit``) and reuses it when present.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import sysconfig
from pathlib import Path

SEED = 20240601
HIDDEN = 64
INTERMEDIATE = 128
DEFAULT_LAYERS = 2
LAYERS = DEFAULT_LAYERS  # --layers N: a deeper model of the same shapes otherwise (benchmarks)
HEADS = 4
KV_HEADS = 2
HEAD_DIM = 32
VOCAB = 4096
DEFAULT_MAX_POSITIONS = 4096

BOS, PAD, IM_START, IM_END = "<|begin_of_text|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [BOS, PAD, IM_START, IM_END]
MARKER_TOKENS = ["<tool_call>", "</tool_call>", "<think>", "</think>"]
TRAINING_BYTES = 1_500_000

# ChatML; with `tools`, a Hermes/Qwen-style system section lists them, assistant tool calls render as
# <tool_call>{json}</tool_call>, and tool results render as turns of role "tool".
CHAT_TEMPLATE = """{{- bos_token }}
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages and messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
    {%- for tool in tools %}
        {{- '\\n' }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}
{%- elif messages and messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'system' %}
        {%- if not loop.first %}
            {{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}
        {%- endif %}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>assistant\\n' }}
        {%- if message.content %}
            {{- message.content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function is defined %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {%- if message.content or not loop.first %}
                    {{- '\\n' }}
                {%- endif %}
                {{- '<tool_call>\\n{"name": "' + tool_call.name + '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == 'tool' %}
        {{- '<|im_start|>tool\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""


def cache_dir() -> Path:
    return Path(os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit").expanduser()


def cached_model_dir(max_positions: int) -> Path:
    digest = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]
    suffix = "" if max_positions == DEFAULT_MAX_POSITIONS else f"-pos{max_positions}"
    suffix += "" if LAYERS == DEFAULT_LAYERS else f"-layers{LAYERS}"
    return cache_dir() / "models" / f"tiny-llama-{digest}{suffix}"


def training_texts() -> list[str]:
    """A fixed, sorted subset of the standard library's top-level .py files."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts, total = [], 0
    for path in sorted(stdlib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        texts.append(text)
        total += len(text)
        if total >= TRAINING_BYTES:
            break
    return texts


def build_tokenizer():
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB - len(MARKER_TOKENS),
        min_frequency=2,
        special_tokens=[AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(training_texts(), trainer)
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in MARKER_TOKENS])
    if tokenizer.get_vocab_size() != VOCAB:
        raise SystemExit(f"error: tokenizer has {tokenizer.get_vocab_size()} tokens, expected {VOCAB}")
    return tokenizer


def build_weights() -> dict:
    import numpy as np

    rng = np.random.default_rng(SEED)

    def normal(shape, std):
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)

    tensors = {"model.embed_tokens.weight": normal((VOCAB, HIDDEN), 1.0)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        tensors[p + "input_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        tensors[p + "self_attn.q_proj.weight"] = normal((HEADS * HEAD_DIM, HIDDEN), 0.1)
        tensors[p + "self_attn.k_proj.weight"] = normal((KV_HEADS * HEAD_DIM, HIDDEN), 0.1)
        tensors[p + "self_attn.v_proj.weight"] = normal((KV_HEADS * HEAD_DIM, HIDDEN), 0.1)
        tensors[p + "self_attn.o_proj.weight"] = normal((HIDDEN, HEADS * HEAD_DIM), 0.1)
        tensors[p + "post_attention_layernorm.weight"] = np.ones(HIDDEN, dtype=np.float32)
        tensors[p + "mlp.gate_proj.weight"] = normal((INTERMEDIATE, HIDDEN), 0.1)
        tensors[p + "mlp.up_proj.weight"] = normal((INTERMEDIATE, HIDDEN), 0.1)
        tensors[p + "mlp.down_proj.weight"] = normal((HIDDEN, INTERMEDIATE), 0.1)
    tensors["model.norm.weight"] = np.ones(HIDDEN, dtype=np.float32)
    # Logits of a few units' spread, so greedy choices are not near-ties that rounding could flip.
    tensors["lm_head.weight"] = normal((VOCAB, HIDDEN), 0.5)
    return tensors


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def build(out: Path, max_positions: int) -> None:
    from safetensors.numpy import save_file

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    tokenizer.save(str(out / "tokenizer.json"), pretty=True)
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS + MARKER_TOKENS}

    save_file(build_weights(), str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o644)
    write_json(out / "config.json", {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "vocab_size": VOCAB,
        "max_position_embeddings": max_positions,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "pretraining_tp": 1,
        "use_cache": True,
        "torch_dtype": "float32",
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[IM_END],
        "pad_token_id": ids[PAD],
    })
    write_json(out / "generation_config.json", {
        "bos_token_id": ids[BOS],
        "eos_token_id": ids[IM_END],
        "pad_token_id": ids[PAD],
        "do_sample": False,
    })
    added = {
        str(ids[t]): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                      "single_word": False, "special": t in SPECIAL_TOKENS}
        for t in SPECIAL_TOKENS + MARKER_TOKENS
    }
    write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "bos_token": BOS,
        "eos_token": IM_END,
        "pad_token": PAD,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_positions,
        "chat_template": CHAT_TEMPLATE,
    })
    write_json(out / "special_tokens_map.json", {"bos_token": BOS, "eos_token": IM_END, "pad_token": PAD})
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE, encoding="utf-8")


def build_cached(max_positions: int) -> Path:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from scripts.support.model_cache import build_once

    return build_once(cached_model_dir(max_positions), lambda folder: build(folder, max_positions))


def check(model_dir: Path) -> None:
    """Load with this interpreter's transformers, run a forward pass and render a tool chat."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32) if int(
        transformers.__version__.split(".")[0]) >= 5 else AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.config.head_dim == HEAD_DIM and model.config.vocab_size == VOCAB, model.config
    assert len(tok) == VOCAB, len(tok)
    assert tok.eos_token == IM_END and tok.bos_token == BOS and tok.pad_token == PAD
    for marker in MARKER_TOKENS:
        assert tok.convert_tokens_to_ids(marker) is not None and not tok.convert_tokens_to_ids(marker) == tok.unk_token_id
        assert marker in tok.decode(tok.encode(f"a {marker} b", add_special_tokens=False), skip_special_tokens=True)
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "id": "call_1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
    ]
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert text.startswith(BOS + IM_START + "system\nBe brief.\n\n# Tools"), text[:80]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text, text
    assert "<|im_start|>tool\n<tool_response>\nsunny\n</tool_response><|im_end|>\n" in text, text
    assert text.endswith("<|im_start|>assistant\n"), text[-40:]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.convert_tokens_to_ids("<tool_call>") in ids
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False)
    new = out[0, len(ids):].tolist()
    print(f"ok: transformers {transformers.__version__}, {len(ids)} prompt tokens, greedy {new}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", nargs="?", type=Path, help="where to write the model")
    parser.add_argument("--max-position-embeddings", type=int, default=DEFAULT_MAX_POSITIONS)
    parser.add_argument("--layers", type=int, default=DEFAULT_LAYERS, help="decoder layers (default 2)")
    parser.add_argument("--cached", action="store_true", help="build into the cache (or reuse it) and print the dir")
    parser.add_argument("--check", type=Path, metavar="DIR", help="load DIR with transformers and exercise it")
    args = parser.parse_args(argv)
    global LAYERS
    if args.layers < 1:
        parser.error("--layers must be at least 1")
    LAYERS = args.layers
    if args.check:
        check(args.check)
        return 0
    if args.cached == (args.out_dir is not None):
        parser.error("give OUT_DIR or --cached (not both)")
    if args.cached:
        print(build_cached(args.max_position_embeddings))
    else:
        build(args.out_dir, args.max_position_embeddings)
        print(args.out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
