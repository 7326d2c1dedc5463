#!/usr/bin/env python
"""A tiny Llama whose greedy output is a chosen script: reasoning, text and tool calls in any order.

    python scripts/make_script_model.py [--out DIR] [--force]

prints the model directory (default ``~/.cache/toolkit/models/script-model-<hash>``, reused when it
exists). The prompt picks the script: the chat template renders only the last user message, and a
message holding a scenario's selector token (``<<reason_tool>>`` ...) makes the model write that
scenario's tokens, then EOS. Each script piece (markers included) is a NON-special added token, so
vLLM's parsers find ``<think>``/``<tool_call>`` in the vocab and in the decoded text.

How the weights work (hand-set, no training; hidden 512, one layer, 4 heads of 128):

* the embedding of a script token is a one-hot "current token" slot plus a constant unit;
* heads 0-2 attend to the token 1, 2, 3 places back: query and key are the same constant vector
  for every position, rotated by RoPE so that the score peaks at that offset (high-frequency
  pairs only); their values copy the one-hot slot into "previous token" blocks P1..P3;
* head 3 attends to the selector token (content-based, in the lowest-frequency pairs where RoPE
  barely rotates) and copies the scenario id into block S;
* each MLP unit fires for one exact context -- (scenario, current, previous ... up to 3 back),
  as short as the script allows -- and writes the next token into block N; lm_head reads N.

Greedy decoding then reproduces each script with a top-2 logit gap far above 60 (``verify()``
checks it with transformers before saving).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from pathlib import Path

# --------------------------------------------------------------------------------------------------
# the scripts

WEATHER = ['{"name": "', "get_weather", '", "arguments": ', '{"city": "']
TIME = ['{"name":"', "get_time", '","arguments":', '{"zone":"']

SCENARIOS: dict[str, list[str]] = {
    # reasoning, then text
    "reason_text": ["<think>", "\n", "The user", " says hello.", "\n", "</think>", "\n\n", "Hello", " there!"],
    # reasoning, then a tool call (upstream: a phantom whitespace message between them)
    "reason_tool": ["<think>", "\n", "I need", " the weather.", "\n", "</think>", "\n\n",
                    "<tool_call>", "\n", *WEATHER, "Paris", '"}', "}", "\n", "</tool_call>"],
    # reasoning, text, two tool calls
    "reason_text_tools": ["<think>", "\n", "Two", " lookups.", "\n", "</think>", "\n\n", "Checking", " both.", "\n",
                          "<tool_call>", "\n", *WEATHER, "Rome", '"}', "}", "\n", "</tool_call>", "\n",
                          "<tool_call>", "\n", *TIME, "CET", '"}}', "\n", "</tool_call>"],
    # text, a tool call, text after it (upstream: the last text is dropped)
    "text_tool_text": ["Let me", " check.", "\n", "<tool_call>", "\n", *WEATHER, "Oslo", '"}', "}", "\n",
                       "</tool_call>", "\n", "Done", " checking."],
    # two tool calls, nothing else
    "tools_only": ["<tool_call>", "\n", *TIME, "UTC", '"}}', "\n", "</tool_call>", "\n",
                   "<tool_call>", "\n", *WEATHER, "Lima", '"}', "}", "\n", "</tool_call>"],
    # an empty reasoning block (upstream: a whitespace-only reasoning item)
    "empty_think": ["<think>", "\n\n", "</think>", "\n\n", "Short", " answer."],
    # plain text
    "text_only": ["Plain", " text", " only."],
    # a tool-call opener split over two tokens (and deltas)
    "split_opener": ["Split", " opener.", "\n", "<tool_", "call>", "\n", *WEATHER, "Kyiv", '"}', "}", "\n",
                     "</tool_call>"],
}
TOOL_MARKERS = ("<think>", "</think>", "<tool_call>", "</tool_call>")

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
CONTEXT = 3  # tokens looked back (heads 0..2)
HIDDEN, HEADS, HEAD_DIM = 512, 4, 128
ROPE_THETA = 10000.0
CHAT_TEMPLATE = (
    "{{ bos_token }}" + PAD * CONTEXT
    + "{%- set m = messages[-1] -%}"
    "{%- if m['content'] is string -%}{{ m['content'] }}"
    "{%- else -%}{%- for p in m['content'] -%}{%- if p['text'] is defined -%}{{ p['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
)

TOOLS = [
    {"type": "function", "name": "get_weather", "description": "Weather for a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
    {"type": "function", "name": "get_time", "description": "Time in a zone.",
     "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}},
]


def selector(name: str) -> str:
    return f"<<{name}>>"


def script_text(name: str) -> str:
    return "".join(SCENARIOS[name])


def _fingerprint() -> str:
    payload = json.dumps([SCENARIOS, CHAT_TEMPLATE, CONTEXT, HIDDEN, HEADS, HEAD_DIM, ROPE_THETA, 3], sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def default_dir() -> Path:
    root = Path((os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit"))
    return root / "models" / f"script-model-{_fingerprint()}"


# --------------------------------------------------------------------------------------------------
# tokenizer


def _training_text() -> list[str]:
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = []
    for path in sorted(stdlib.glob("*.py"))[:40]:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue
    return texts


def build_tokenizer(out: Path):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=[BOS, EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_training_text(), trainer=trainer)
    pieces: list[str] = []
    for name, tokens in SCENARIOS.items():
        for piece in [selector(name), *tokens]:
            if piece not in pieces:
                pieces.append(piece)
    tok.add_tokens([AddedToken(p, special=False, normalized=False, single_word=False, lstrip=False, rstrip=False)
                    for p in pieces])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD,
                                   clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


# --------------------------------------------------------------------------------------------------
# weights


def _contexts(tokenizer) -> tuple[list[tuple[int, tuple[int, ...], int]], dict[str, list[int]], dict[str, list[int]]]:
    """Per scenario: prompt ids, script ids; and the MLP units (scenario, context ids, next id)."""
    prompts, scripts = {}, {}
    units: dict[tuple[int, tuple[int, ...]], int] = {}
    for s, name in enumerate(SCENARIOS):
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": selector(name)}], tokenize=True,
                                               add_generation_prompt=True)
        prompt = list(prompt["input_ids"] if isinstance(prompt, dict) else prompt)
        script = [tokenizer.convert_tokens_to_ids(t) for t in SCENARIOS[name]]
        assert tokenizer.decode(script) == script_text(name), (name, tokenizer.decode(script))
        prompts[name], scripts[name] = prompt, script
        seq = prompt + script + [tokenizer.eos_token_id]
        start = len(prompt) - 1
        occurrences = []
        for i in range(start, len(seq) - 1):
            # context: current token, then previous ones (up to CONTEXT)
            occurrences.append((tuple(seq[max(0, i - CONTEXT): i + 1][::-1]), seq[i + 1], i == start))
        for ctx, nxt, first in occurrences:
            if first:
                key = ctx[:1]  # the selector itself: unique to the scenario
            else:
                for k in range(1, CONTEXT + 2):
                    key = ctx[:k]
                    if all(n == nxt for c, n, _ in occurrences if c[:k] == key):
                        break
                else:
                    raise SystemExit(f"scenario {name}: context {ctx} is ambiguous beyond {CONTEXT} tokens back")
            units[(s, key)] = nxt
    return [(s, key, nxt) for (s, key), nxt in units.items()], prompts, scripts


def build_model(tokenizer, out: Path):
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    units, prompts, scripts = _contexts(tokenizer)
    vocab = len(tokenizer)
    used = sorted({t for p in prompts.values() for t in p} | {t for s in scripts.values() for t in s}
                  | {tokenizer.eos_token_id})
    slot = {t: i for i, t in enumerate(used)}
    k_slots = len(used)
    n_scen = len(SCENARIOS)
    assert k_slots <= HEAD_DIM, f"{k_slots} distinct tokens do not fit a head ({HEAD_DIM})"
    # residual layout
    C, P, S = 0, k_slots, k_slots * (1 + CONTEXT)
    N = S + n_scen
    CONST = N + k_slots
    assert CONST < HIDDEN, "hidden size too small for the scripts"
    inter = max(64, math.ceil(len(units) / 64) * 64)

    config = LlamaConfig(
        vocab_size=vocab, hidden_size=HIDDEN, intermediate_size=inter, num_hidden_layers=1,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=HEAD_DIM, max_position_embeddings=1024,
        rope_theta=ROPE_THETA, rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu",
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(torch.float32)
    sd = {k: torch.zeros_like(v) for k, v in model.state_dict().items()}

    # embeddings: one-hot slot + constant
    emb = sd["model.embed_tokens.weight"]
    emb[:, CONST] = 1.0
    for t, i in slot.items():
        emb[t, C + i] = 1.0
    r_attn = math.sqrt(HIDDEN / 2.0)  # normalized value of a unit entry at the attention input
    r_mlp = math.sqrt(HIDDEN / (3.0 + CONTEXT))  # ... at the MLP input (C, const, P1..P3, S)

    layer = "model.layers.0."
    sd[layer + "input_layernorm.weight"].fill_(1.0)
    sd[layer + "post_attention_layernorm.weight"].fill_(1.0)
    q, k, v, o = (sd[layer + f"self_attn.{n}_proj.weight"] for n in "qkvo")
    half = HEAD_DIM // 2
    theta = ROPE_THETA ** (-torch.arange(half, dtype=torch.float64) * 2 / HEAD_DIM)
    # heads 0..CONTEXT-1: offset d = h + 1, high-frequency pairs only
    magnitude = 14.0
    for h in range(CONTEXT):
        d = h + 1
        base = h * HEAD_DIM
        for pair in range(half):
            if theta[pair] < 0.1:
                continue
            q[base + pair, CONST] = magnitude / r_attn
            k[base + pair, CONST] = magnitude * math.cos(d * theta[pair]) / r_attn
            k[base + half + pair, CONST] = magnitude * math.sin(d * theta[pair]) / r_attn
        for t, i in slot.items():
            v[base + i, C + i] = 1.0 / r_attn
            o[P + h * k_slots + i, base + i] = 1.0
    # head CONTEXT: the selector, in the lowest-frequency pairs
    base = CONTEXT * HEAD_DIM
    low = list(range(half - 8, half))
    for pair in low:
        q[base + pair, CONST] = 8.0 / r_attn
    for s, name in enumerate(SCENARIOS):
        sel = slot[tokenizer.convert_tokens_to_ids(selector(name))]
        for pair in low:
            k[base + pair, C + sel] = 8.0 / r_attn
        v[base + s, C + sel] = 1.0 / r_attn
        o[S + s, base + s] = 1.0

    # MLP: one unit per context
    gate, up, down = (sd[layer + f"mlp.{n}_proj.weight"] for n in ("gate", "up", "down"))
    a, target = 30.0, 40.0
    for u, (s, key, nxt) in enumerate(units):
        features = [S + s] + [(C if j == 0 else P + (j - 1) * k_slots) + slot[t] for j, t in enumerate(key)]
        for f in features:
            gate[u, f] = a / r_mlp
        gate[u, CONST] = -(len(features) - 0.5) * a / r_mlp
        up[u, CONST] = 1.0 / r_mlp
        down[N + slot[nxt], u] = target / (0.5 * a)

    sd["model.norm.weight"][N:N + k_slots] = 1.0
    head = sd["lm_head.weight"]
    for t, i in slot.items():
        head[t, N + i] = 10.0
    model.load_state_dict(sd)
    model.generation_config = GenerationConfig(bos_token_id=tokenizer.bos_token_id,
                                               eos_token_id=tokenizer.eos_token_id, do_sample=False)
    return model, prompts, scripts


def verify(model, tokenizer, prompts, scripts) -> float:
    """Teacher-forced check of every script: argmax is the script's next token; returns the min gap."""
    import torch

    worst = float("inf")
    for name in SCENARIOS:
        seq = prompts[name] + scripts[name] + [tokenizer.eos_token_id]
        with torch.no_grad():
            logits = model(torch.tensor([seq])).logits[0]
        for i in range(len(prompts[name]) - 1, len(seq) - 1):
            top = torch.topk(logits[i], 2)
            if int(top.indices[0]) != seq[i + 1]:
                raise SystemExit(f"scenario {name}: position {i} predicts "
                                 f"{tokenizer.convert_ids_to_tokens(int(top.indices[0]))!r}, "
                                 f"expected {tokenizer.convert_ids_to_tokens(seq[i + 1])!r}")
            worst = min(worst, float(top.values[0] - top.values[1]))
        with torch.no_grad():
            ids = torch.tensor([prompts[name]])
            generated = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(scripts[name]) + 4,
                                       do_sample=False, pad_token_id=tokenizer.pad_token_id)[0, len(prompts[name]):].tolist()
        if generated and generated[-1] == tokenizer.eos_token_id:
            generated = generated[:-1]
        if tokenizer.decode(generated) != script_text(name):
            raise SystemExit(f"scenario {name}: greedy output {tokenizer.decode(generated)!r}")
    return worst


def make(out: Path | None = None, force: bool = False) -> Path:
    out = out or default_dir()
    if (out / "config.json").exists() and (out / "DONE").exists() and not force:
        return out
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    model, prompts, scripts = build_model(tokenizer, out)
    gap = verify(model, tokenizer, prompts, scripts)
    if gap < 60:
        raise SystemExit(f"top-2 logit gap {gap:.1f} is below 60")
    model.save_pretrained(out, safe_serialization=True)
    model.generation_config.save_pretrained(out)
    (out / "scenarios.json").write_text(json.dumps({"scenarios": SCENARIOS, "min_gap": gap}, indent=1))
    (out / "DONE").write_text("ok\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--force", action="store_true")
    args = parser.parse_args(argv)
    print(make(args.out, args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
