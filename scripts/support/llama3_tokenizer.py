"""Llama 3's tokenizer (scripts/support/family_tokenizers.py's "llama3" source).

Meta's ``llama-models`` wheel on the package index ships Llama 3's tiktoken ranks (``llama_models/llama3/
tokenizer.model``, 128,000 byte-level BPE ranks) and the ``Tokenizer`` class that reads them
(``llama_models/llama3/tokenizer.py``: the split pattern and the 256 special tokens after the ranks, ids
128000-128255). Both are pinned here by sha256 (and the wheel's). The ranks are converted to a Hugging Face fast
tokenizer laid out as Llama 3's published tokenizer.json (the split pattern isolated, byte-level BPE, no
normaliser, ``<|begin_of_text|>`` put in front of an encoding), checked at build time against tiktoken's merge on
varied text (tests/scripts_families compares with the wheel's own ``Tokenizer``). The chat template is
Llama 3.1's with JSON tool calls as vLLM ships it for its llama3_json parser, pinned in
tests/upstream/families/llama/.
"""

from __future__ import annotations

from pathlib import Path

from scripts.support import family_tokenizers as ft

LLAMA_WHEEL = ("llama-models", "llama_models-0.3.0-py3-none-any.whl",
               "7f77f78ff13fca09f70d76a376aff6414cd901623fb9d57e69c2f8367a73032f")
RANKS = ("llama_models/llama3/tokenizer.model", "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55")
# the Tokenizer class the names, the pattern and the ids below are read from (and the test runs)
TOKENIZER_PY = ("llama_models/llama3/tokenizer.py", "03651bf842642adf7ae2fcb5afe4cd211c7fdb23180babc42a9c635d4bc8fc11")
RANK_COUNT = 128000
# Tokenizer.pat_str: Qwen's but for digits, which go in runs of up to three
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
           r"\s*[\r\n]+|\s+(?!\S)|\s+")
# Tokenizer.__init__'s special tokens from id 128000 on, then <|reserved_special_token_2|> ... _245|> up to 256
NAMED_SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                 "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>", "<|start_header_id|>",
                 "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>", "<|image|>")
NUM_SPECIAL = 256
VOCAB_SIZE = RANK_COUNT + NUM_SPECIAL  # 128,256: Llama 3's embedding rows
BOS, END_OF_TEXT, EOM, EOT = 128000, 128001, 128008, 128009
# "This is a test sentence." as the wheel's own tests/api/test_tokenizer.py publishes it (bos in front)
PUBLISHED = ("This is a test sentence.", [BOS, 2028, 374, 264, 1296, 11914, 13])

# Texts beyond family_tokenizers.SAMPLES where Llama 3's pattern differs from Qwen's: runs of digits cut in threes
LLAMA_SAMPLES = (
    "1234567 12 123 1234 3.14159265358979 2024-07-23 $1,000,000.00 +33612345678",
    "x1y22z333w4444 v55555 ١٢٣٤٥ 一二三四",
)


def special_tokens() -> list[str]:
    return [*NAMED_SPECIAL, *(f"<|reserved_special_token_{2 + i}|>" for i in range(NUM_SPECIAL - len(NAMED_SPECIAL)))]


def ranks() -> dict[bytes, int]:
    found = ft.tiktoken_ranks(ft.wheel_member(LLAMA_WHEEL, *RANKS))
    if sorted(found.values()) != list(range(RANK_COUNT)):
        raise ft.TokenizerError(f"{RANKS[0]}: {len(found)} ranks, not 0..{RANK_COUNT - 1} once each")
    return found


def check_tokenizer_py() -> None:
    """The wheel's tokenizer.py is the pinned one, and it says what this module says (read, not run)."""
    text = ft.wheel_member(LLAMA_WHEEL, *TOKENIZER_PY).decode("utf-8")
    missing = [s for s in (PATTERN, *NAMED_SPECIAL, "num_reserved_special_tokens = 256",
                           'f"<|reserved_special_token_{2 + i}|>"') if s not in text]
    if missing:
        raise ft.TokenizerError(f"{TOKENIZER_PY[0]} does not say {missing[0]!r}")


def convert(rank_table: dict[bytes, int]):
    """A ``tokenizers`` Tokenizer: rank r at id r, the 256 special tokens at 128000-128255, bos in front."""
    vocab, merges = ft.vocab_and_merges(rank_table)
    return ft.bos_byte_level_bpe(vocab, merges, PATTERN, ("<|begin_of_text|>", BOS), special_tokens(), BOS,
                                 "special tokens")


def samples() -> list[str]:
    return [*ft.qwen_samples(), *LLAMA_SAMPLES]


def make(out: Path) -> ft.Written:
    check_tokenizer_py()
    rank_table = ranks()
    tokenizer = convert(rank_table)
    reference = ft.reference_encoder(rank_table, PATTERN, nfc=False)  # tiktoken normalises nothing
    for text in samples():
        got, want = tokenizer.encode(text).ids, [BOS, *reference(text)]
        if got != want:
            raise ft.TokenizerError(f"the converted Llama 3 tokenizer encodes {text[:40]!r} as {got[:12]}..., "
                                    f"tiktoken's merge of {RANKS[0]} as {want[:12]}...")
    tokenizer.save(str(out / "tokenizer.json"), pretty=True)
    template = ft.pinned_file("llama", "chat_template.jinja").decode("utf-8")
    added = {str(BOS + i): ft.added_token(t, True) for i, t in enumerate(special_tokens())}
    # as Llama-3.1-8B-Instruct's tokenizer_config.json (the turn's end is the eos, no pad token) but for one
    # value: it sets clean_up_tokenization_spaces, with which transformers' decode drops the space before
    # punctuation (" ," -> ","), and vLLM's incremental detokenizer does not: decode is kept exact here, as the
    # engines stream it, so a check comparing the two compares the tokens (docs/families.md)
    ft.write_json(out / "tokenizer_config.json", {
        "added_tokens_decoder": added, "bos_token": "<|begin_of_text|>", "chat_template": template,
        "clean_up_tokenization_spaces": False, "eos_token": "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"], "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast"})
    ft.write_json(out / "special_tokens_map.json", {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    # Llama 3.1's stop ids (the text's end, a message's end after a tool call, the turn's end); greedy by default
    # (no published sampling values are pinned here)
    eos = [END_OF_TEXT, EOM, EOT]
    ft.write_json(out / "generation_config.json", {"bos_token_id": BOS, "eos_token_id": eos, "do_sample": False})
    return ft.Written({"vocab_size": VOCAB_SIZE, "bos_token_id": BOS, "eos_token_id": eos})


def check(tok) -> None:
    assert len(tok) == VOCAB_SIZE, len(tok)
    specials = special_tokens()
    assert tok.convert_tokens_to_ids(specials) == list(range(BOS, BOS + NUM_SPECIAL))
    assert tok.convert_tokens_to_ids(["<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>",
                                      "<|python_tag|>"]) == [128006, 128007, EOM, EOT, 128010]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (BOS, EOT, None)
    assert tok.encode(PUBLISHED[0]) == PUBLISHED[1]
    assert tok.encode(PUBLISHED[0], add_special_tokens=False) == PUBLISHED[1][1:]
    for text in [*ft.SAMPLES, "a , b . c ! d ?"]:
        assert tok.decode(tok.encode(text, add_special_tokens=False)) == text, text
    text = "<|start_header_id|>assistant<|end_header_id|>\n\nhi<|eot_id|>"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids == [128006, 78191, 128007, 271, 6151, EOT], ids  # "assistant", "\n\n", "hi" (published ids)
    assert tok.decode(ids, skip_special_tokens=True) == "assistant\n\nhi"
