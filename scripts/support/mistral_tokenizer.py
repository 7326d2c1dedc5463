"""Mistral-Nemo's tekken tokenizer (scripts/support/family_tokenizers.py's "mistral-nemo" source).

mistral-common's pinned wheel ships ``tekken_240718.json``, the tokenizer of Mistral-Nemo-Instruct-2407: 150,000
byte-level BPE ranks of which the first 130,072 are used, and 1,000 control tokens in front of them (ids 0-999:
``<unk>``, ``<s>``, ``</s>``, ``[INST]``, ... and ``<SPECIAL_20>`` to ``<SPECIAL_999>``), so a rank r is the id
r + 1000. It is converted here to a Hugging Face fast tokenizer laid out as Mistral-Nemo's published
tokenizer.json (tekken's split pattern, byte-level BPE, no normalizer, ``<s>`` in front of an encoding) and
checked at build time against tiktoken's merge on varied text, as mistral-common's ``Tekkenizer.encode(text,
bos=True, eos=False)`` computes it (tests/scripts_families compares with mistral-common itself). The chat template
is Mistral-Nemo-Instruct-2407's, pinned in tests/upstream/families/mistral-nemo/.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from scripts.support import family_tokenizers as ft

MISTRAL_WHEEL = ("mistral-common", "mistral_common-1.13.1-py3-none-any.whl",
                 "98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af")
TEKKEN = ("mistral_common/data/tekken_240718.json", "eccd1665d2e477697c33cb7f0daa6f6dfefc57a0a6bceb66d4be52952f827516")
# Tekkenizer.DEPRECATED_SPECIAL_TOKENS of mistral-common (the file names none: version v3 takes these), ids 0-19;
# ids 20-999 are <SPECIAL_id> fillers
CONTROL_TOKENS = ("<unk>", "<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                  "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "<pad>", "[IMG_BREAK]", "[IMG_END]",
                  "[PREFIX]", "[MIDDLE]", "[SUFFIX]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]")
NUM_SPECIAL = 1000
VOCAB_SIZE = 131072  # the file's default_vocab_size: Mistral-Nemo's embedding rows
BOS, EOS, UNK = 1, 2, 0

# Texts beyond family_tokenizers.SAMPLES where tekken's pattern differs from Qwen's: case runs ("HTTPServer",
# "McDonald's"), combining marks kept with their letter, a slash after punctuation, French and German
MISTRAL_SAMPLES = (
    "HTTPServer parses XMLHttpRequest; McDonald's and iPhone ABCdef aBC",
    "Le garçon a mangé déjà l'œuf; Straße größer ÄÖÜ",
    "e\u0301cole a\u0300 co\u0302te\u0301 -- https://example.com/a/b?c=d, ./path//x",
    "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123XYZ\"}]",
)


def control_tokens() -> list[str]:
    return [*CONTROL_TOKENS, *(f"<SPECIAL_{i}>" for i in range(len(CONTROL_TOKENS), NUM_SPECIAL))]


def tekken() -> tuple[dict[bytes, int], str]:
    """The ranks (as Tekkenizer cuts them: the first default_vocab_size - 1000) and the split pattern."""
    data = json.loads(ft.wheel_member(MISTRAL_WHEEL, *TEKKEN))
    config = data["config"]
    if (config["default_vocab_size"], config["default_num_special_tokens"], config["version"]) != \
            (VOCAB_SIZE, NUM_SPECIAL, "v3") or "special_tokens" in data:
        raise ft.TokenizerError(f"{TEKKEN[0]}: config {config} is not the v3 tekken this builder converts")
    inner = VOCAB_SIZE - NUM_SPECIAL
    ranks = {base64.b64decode(entry["token_bytes"]): entry["rank"] for entry in data["vocab"][:inner]}
    if sorted(ranks.values()) != list(range(inner)):
        raise ft.TokenizerError(f"{TEKKEN[0]}: the first {inner} ranks are not 0..{inner - 1}, once each")
    return ranks, config["pattern"]


def convert(ranks: dict[bytes, int], pattern: str):
    """A ``tokenizers`` Tokenizer: the 1,000 control tokens at ids 0-999, rank r at id r + 1000."""
    rank_vocab, merges = ft.vocab_and_merges(ranks)
    vocab = {text: rank + NUM_SPECIAL for text, rank in rank_vocab.items()}
    controls = control_tokens()
    clash = [t for t in controls if t in vocab]
    if clash:
        raise ft.TokenizerError(f"control tokens {clash[:3]} are also byte-level tokens of {TEKKEN[0]}")
    vocab.update({content: i for i, content in enumerate(controls)})
    return ft.bos_byte_level_bpe(vocab, merges, pattern, ("<s>", BOS), controls, 0, "control tokens")


def samples() -> list[str]:
    return [*ft.qwen_samples(), *MISTRAL_SAMPLES]


def make(out: Path) -> ft.Written:
    ranks, pattern = tekken()
    tokenizer = convert(ranks, pattern)
    reference = ft.reference_encoder(ranks, pattern, nfc=False)  # Tekkenizer normalises nothing
    for text in samples():
        got = tokenizer.encode(text).ids
        want = [BOS, *(i + NUM_SPECIAL for i in reference(text))]
        if got != want:
            raise ft.TokenizerError(f"the converted tekken tokenizer encodes {text[:40]!r} as {got[:12]}..., "
                                    f"tiktoken's merge of {TEKKEN[0]} as {want[:12]}...")
    tokenizer.save(str(out / "tokenizer.json"), pretty=True)
    template = ft.pinned_file("mistral-nemo", "chat_template.jinja").decode("utf-8")
    added = {str(i): ft.added_token(t, True) for i, t in enumerate(control_tokens())}
    ft.write_json(out / "tokenizer_config.json", {
        "add_bos_token": True, "add_eos_token": False, "added_tokens_decoder": added, "bos_token": "<s>",
        "chat_template": template, "clean_up_tokenization_spaces": False, "eos_token": "</s>",
        "model_max_length": 1024000, "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>"})
    ft.write_json(out / "special_tokens_map.json", {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    # Mistral-Nemo-Instruct-2407's generation config: bos 1, eos 2, nothing else
    ft.write_json(out / "generation_config.json", {"bos_token_id": BOS, "eos_token_id": EOS})
    return ft.Written({"vocab_size": VOCAB_SIZE, "bos_token_id": BOS, "eos_token_id": EOS})


def check(tok) -> None:
    assert len(tok) == VOCAB_SIZE, len(tok)
    assert tok.convert_tokens_to_ids(list(CONTROL_TOKENS)) == list(range(len(CONTROL_TOKENS)))
    assert tok.convert_tokens_to_ids("<SPECIAL_999>") == NUM_SPECIAL - 1
    assert (tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (BOS, EOS, UNK)
    assert tok.encode("Hello")[0] == BOS and tok.encode("Hello", add_special_tokens=False)[0] >= NUM_SPECIAL
    for text in ft.SAMPLES:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text, text
    ids = tok.encode("[TOOL_CALLS][{}]</s>", add_special_tokens=False)
    assert ids[0] == 9 and ids[-1] == EOS, ids
