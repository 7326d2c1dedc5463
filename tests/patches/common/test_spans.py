"""Span resolution (patches/common/spans.py): examples on the tiny model's tokenizer, then properties.

The properties run hypothesis over random texts and spans: the fast tokenizer's offset mapping and
incremental detokenization give the same characters for every token and so select the same tokens,
selected tokens always cover the span, and special tokens are never selected.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.patches.common.spans import (
    ALL_PROMPT,
    Span,
    SpanError,
    TokenOffsets,
    dedup_positions,
    incremental_char_offsets,
    mapping_char_offsets,
    prompt_char_offsets,
    resolve_positions,
    span_positions,
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


class SlowView:
    """The same tokenizer seen as a slow one (no offset mapping): forces incremental detokenization."""

    is_fast = False

    def __init__(self, inner):
        self.inner = inner
        self.all_special_ids = inner.all_special_ids
        self.added_tokens_decoder = inner.added_tokens_decoder

    def decode(self, ids, skip_special_tokens=False):  # no clean-up flag: the fallback call path
        return self.inner.decode(ids, skip_special_tokens=skip_special_tokens, clean_up_tokenization_spaces=False)


def with_bos(tokenizer, text):
    return [tokenizer.bos_token_id, *tokenizer(text, add_special_tokens=False)["input_ids"]]


def test_offsets_come_from_the_mapping_of_a_fast_tokenizer(tokenizer):
    text = "The cat sat on the mat."
    ids = tokenizer(text)["input_ids"]
    offsets = prompt_char_offsets(tokenizer, text, ids)
    assert offsets.source == "offset_mapping" and offsets.text == text
    assert "".join(text[s:e] for s, e in offsets.offsets) == text


def test_slow_tokenizer_falls_back_to_incremental_detokenization(tokenizer):
    text = "The cat sat on the mat."
    ids = tokenizer(text)["input_ids"]
    offsets = prompt_char_offsets(SlowView(tokenizer), text, ids)
    assert offsets.source == "incremental" and offsets.text == text
    assert offsets.offsets == prompt_char_offsets(tokenizer, text, ids).offsets


def test_ids_the_text_does_not_encode_to_fall_back_to_incremental(tokenizer):
    text = "The cat"
    ids = with_bos(tokenizer, text)  # this tokenizer adds no BOS itself: the mapping cannot reproduce ids
    assert mapping_char_offsets(tokenizer, text, ids, tokenizer.all_special_ids) is None
    offsets = prompt_char_offsets(tokenizer, text, ids)
    assert offsets.source == "incremental" and offsets.offsets[0] == (0, 0)


def test_bos_is_an_empty_span_and_never_selected(tokenizer):
    text = "cat cat"
    ids = with_bos(tokenizer, text)
    offsets = prompt_char_offsets(tokenizer, text, ids)
    assert offsets.offsets[0][0] == offsets.offsets[0][1]
    assert 0 not in span_positions(offsets, "cat", 0)
    assert 0 not in resolve_positions([{"span": "c"}], offsets)


def test_special_token_inside_the_text_is_never_selected(tokenizer):
    text = "a <|im_start|> b"
    ids = tokenizer(text)["input_ids"]
    special = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert special in ids
    offsets = prompt_char_offsets(tokenizer, text, ids)
    index = ids.index(special)
    assert offsets.offsets[index][0] == offsets.offsets[index][1]
    with pytest.raises(SpanError, match="covers no token"):
        span_positions(offsets, "im_start")


def test_span_selects_the_tokens_overlapping_it(tokenizer):
    text = "The cat sat on the mat."
    ids = tokenizer(text)["input_ids"]
    offsets = prompt_char_offsets(tokenizer, text, ids)
    # ' c' + 'at' cover "cat"; 'at' of "sat" and " mat" are other tokens
    assert span_positions(offsets, "cat") == [1, 2]
    assert span_positions(offsets, "at", 1) == [4]
    assert span_positions(offsets, "at", 2) == [7]


def test_mixed_list_expands_in_order_without_duplicates(tokenizer):
    text = "The cat sat on the mat."
    offsets = prompt_char_offsets(tokenizer, text, tokenizer(text)["input_ids"])
    items = [4, {"span": "cat"}, Span("at", 1), 0, {"span": "cat", "occurrence": 0}]
    assert resolve_positions(items, offsets) == [4, 1, 2, 0]
    assert resolve_positions(ALL_PROMPT, offsets) == list(range(len(offsets.offsets)))


@pytest.mark.parametrize(
    "items,message",
    [
        ([{"span": ""}], "empty span"),
        ([{"span": "dog"}], "not found"),
        ([{"span": "cat", "occurrence": 1}], "occurrence 1 out of range"),
        ([{"span": "cat", "occurrence": -1}], "occurrence must be >= 0"),
        ([99], "position 99 out of range"),
        ([-1], "position -1 out of range"),
        ([], "positions is empty"),
        ("first", "positions must be a list"),
        ([1.5], "must be an integer"),
        ([True], "must be an integer"),
        ([{"span": "cat", "extra": 1}], "span position is"),
        ([{"span": "cat", "occurrence": "0"}], "occurrence must be an integer"),
    ],
)
def test_bad_positions_raise_span_error(tokenizer, items, message):
    text = "The cat sat."
    offsets = prompt_char_offsets(tokenizer, text, tokenizer(text)["input_ids"])
    with pytest.raises(SpanError, match=message):
        resolve_positions(items, offsets)


def test_partial_utf8_tokens_overlap_their_character():
    # a byte-level tokenizer split "é" into two tokens: the decoder shows U+FFFD after the first
    pieces = {1: b"x", 2: b"\xc3", 3: b"\xa9", 4: b"y"}

    def decode(ids):
        return b"".join(pieces[i] for i in ids).decode("utf-8", errors="replace")

    text, offsets = incremental_char_offsets(decode, [1, 2, 3, 4])
    assert text == "xéy" and offsets == [(0, 1), (1, 2), (1, 2), (2, 3)]


def test_dedup_keeps_first_appearance():
    assert dedup_positions([3, 1, 3, 2, 1]) == [3, 1, 2]


# --------------------------------------------------------------------------------------------------
# properties

ALPHABET = st.sampled_from(list("abc xyz.,!?\n\t0123") + ["é", "ß", "中", "😀", "  ", "cat", " the"])
TEXTS = st.lists(ALPHABET, min_size=1, max_size=30).map("".join)
PROPERTY = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@PROPERTY
@given(text=TEXTS, data=st.data())
def test_both_offset_sources_select_the_same_tokens(tokenizer, text, data):
    ids = tokenizer(text)["input_ids"]
    fast = prompt_char_offsets(tokenizer, text, ids)
    slow = prompt_char_offsets(SlowView(tokenizer), text, ids)
    assert fast.source == "offset_mapping" and slow.source == "incremental"
    assert slow.text == text
    assert fast.offsets == slow.offsets
    start = data.draw(st.integers(0, len(text) - 1))
    end = data.draw(st.integers(start + 1, len(text)))
    substring = text[start:end]
    occurrence = _occurrence_index(text, substring, start)
    assert span_positions(fast, substring, occurrence) == span_positions(slow, substring, occurrence)


@PROPERTY
@given(text=TEXTS, data=st.data())
def test_selected_tokens_cover_the_span_and_skip_bos(tokenizer, text, data):
    ids = with_bos(tokenizer, text)
    offsets = prompt_char_offsets(tokenizer, text, ids)
    start = data.draw(st.integers(0, len(text) - 1))
    end = data.draw(st.integers(start + 1, len(text)))
    positions = span_positions(offsets, text[start:end], _occurrence_index(text, text[start:end], start))
    assert 0 not in positions
    assert positions == sorted(positions) and positions == list(range(positions[0], positions[-1] + 1))
    covered = offsets.offsets[positions[0]][0], offsets.offsets[positions[-1]][1]
    assert covered[0] <= start and covered[1] >= end


@PROPERTY
@given(items=st.lists(st.integers(0, 9), max_size=20))
def test_integer_lists_keep_order_and_drop_repeats(items):
    offsets = TokenOffsets("x" * 10, tuple((i, i + 1) for i in range(10)), "incremental")
    if not items:
        return
    resolved = resolve_positions(items, offsets)
    assert len(resolved) == len(set(items)) and set(resolved) == set(items)
    assert resolved == sorted(set(items), key=items.index)


def _occurrence_index(text: str, substring: str, start: int) -> int:
    """Which occurrence (overlapping matches counted) of ``substring`` starts at ``start``."""
    return sum(1 for i in range(start) if text.startswith(substring, i))
