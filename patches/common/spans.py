"""Substring spans of a prompt -> token positions, shared by the patch-sweep server and its client.

A position in an activation-patching sweep is a token index of the (corrupt) prompt. Users think in
words, so a position may also be a span: ``{"span": "cat", "occurrence": 0}`` selects every token
whose characters overlap the first occurrence of "cat". Resolution works on the prompt tokenized
exactly as the sweep is (the ids the engine runs):

* character offsets come from the fast tokenizer's offset mapping when the tokenizer has one and
  re-encoding the text gives the same ids (offsets then index the original prompt);
* otherwise from incremental detokenization: decode growing id prefixes and take each token's
  characters as what its id adds (offsets then index the decoded text);
* special tokens (BOS and the like) map to an empty span and are never selected.

A list of positions (integers and spans mixed) expands in order and drops duplicates across the whole
list. Every mistake is a :class:`SpanError` (a ``ValueError``) whose message says what to change; the
server turns it into a 400.

This module imports nothing of the engine, torch or the patch engine: the engine process and the
client both load it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Sequence

__all__ = [
    "ALL_PROMPT",
    "Span",
    "SpanError",
    "TokenOffsets",
    "dedup_positions",
    "find_occurrence",
    "incremental_char_offsets",
    "mapping_char_offsets",
    "parse_position",
    "prompt_char_offsets",
    "resolve_positions",
    "span_positions",
]

ALL_PROMPT = "all_prompt"
REPLACEMENT = "\ufffd"  # what a decoder prints for the bytes of a character it has not seen whole yet


class SpanError(ValueError):
    """A position list that cannot be resolved against the prompt (the server answers 400)."""


@dataclass(frozen=True)
class Span:
    """The tokens overlapping the ``occurrence``-th (0-based) occurrence of ``text`` in the prompt."""

    text: str
    occurrence: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"span": self.text, "occurrence": self.occurrence}


@dataclass(frozen=True)
class TokenOffsets:
    """Each token's ``[start, end)`` characters in ``text``; ``source`` says where they came from."""

    text: str
    offsets: tuple[tuple[int, int], ...]
    source: str  # "offset_mapping" or "incremental"


# --------------------------------------------------------------------------------------------------
# character offsets of each token


def mapping_char_offsets(
    tokenizer: Any, text: str, ids: Sequence[int], special_ids: Iterable[int] = ()
) -> list[tuple[int, int]] | None:
    """Offsets from a fast tokenizer's offset mapping, or None when it has none or its encoding of
    ``text`` (with or without special tokens) is not ``ids``."""
    if not getattr(tokenizer, "is_fast", False):
        return None
    special = set(special_ids)
    for add_special in (True, False):
        try:
            encoded = tokenizer(text, add_special_tokens=add_special, return_offsets_mapping=True)
        except Exception:  # a tokenizer wrapper without offsets: use the other source
            return None
        if list(encoded["input_ids"]) == list(ids):
            mapping = encoded["offset_mapping"]
            return [(int(s), int(s)) if i in special else (int(s), int(e)) for i, (s, e) in zip(ids, mapping)]
    return None


def incremental_char_offsets(
    decode: Callable[[list[int]], str], ids: Sequence[int], special_ids: Iterable[int] = ()
) -> tuple[str, list[tuple[int, int]]]:
    """Offsets from decoding growing prefixes of ``ids`` (special tokens skipped by ``decode``).

    A token ends where the decoded prefix through it ends; it starts where the complete characters
    before it end, so a token that carries only some bytes of a character overlaps that character
    (as an offset mapping says too). Returns the decoded text and the offsets into it.
    """
    special = set(special_ids)
    ids = list(ids)
    offsets: list[tuple[int, int]] = []
    previous = ""
    for index, token in enumerate(ids):
        current = decode(ids[: index + 1])
        start = len(previous.rstrip(REPLACEMENT))
        if token in special:
            offsets.append((start, start))
        else:
            offsets.append((min(start, len(current)), len(current)))
        previous = current
    return previous, offsets


def prompt_char_offsets(tokenizer: Any, text: str, ids: Sequence[int]) -> TokenOffsets:
    """Each token's characters: the offset mapping when it reproduces ``ids``, else incremental
    detokenization. ``tokenizer`` is a Hugging Face tokenizer or anything with ``decode`` and
    ``all_special_ids`` (vLLM's tokenizer wrappers)."""
    special = _special_ids(tokenizer)
    mapped = mapping_char_offsets(tokenizer, text, ids, special)
    if mapped is not None:
        return TokenOffsets(text, tuple(mapped), "offset_mapping")
    decoded, offsets = incremental_char_offsets(_decoder(tokenizer), ids, special)
    return TokenOffsets(decoded, tuple(offsets), "incremental")


def _special_ids(tokenizer: Any) -> set[int]:
    """The special tokens map's ids plus every added token marked special (e.g. ChatML markers)."""
    ids = {int(i) for i in (getattr(tokenizer, "all_special_ids", None) or ()) if i is not None}
    try:
        added = dict(getattr(tokenizer, "added_tokens_decoder", None) or {})
    except Exception:  # a wrapper that computes it and fails: the special tokens map is enough
        added = {}
    return ids | {int(i) for i, token in added.items() if getattr(token, "special", False)}


def _decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    def decode(ids: list[int]) -> str:
        try:
            return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        except TypeError:  # a wrapper that does not take the cleanup flag
            return tokenizer.decode(ids, skip_special_tokens=True)

    return decode


# --------------------------------------------------------------------------------------------------
# spans and position lists


def find_occurrence(text: str, substring: str, occurrence: int) -> tuple[int, int]:
    """``[start, end)`` of the ``occurrence``-th (0-based, overlapping matches counted) ``substring``."""
    if not substring:
        raise SpanError("empty span: a span must be a non-empty substring of the prompt")
    if occurrence < 0:
        raise SpanError(f"span {substring!r}: occurrence must be >= 0, got {occurrence}")
    starts: list[int] = []
    at = text.find(substring)
    while at != -1:
        starts.append(at)
        at = text.find(substring, at + 1)
    if not starts:
        raise SpanError(f"span {substring!r} not found in the prompt")
    if occurrence >= len(starts):
        raise SpanError(
            f"span {substring!r}: occurrence {occurrence} out of range "
            f"(the prompt has {len(starts)} occurrence{'s' if len(starts) != 1 else ''}, numbered from 0)"
        )
    return starts[occurrence], starts[occurrence] + len(substring)


def span_positions(offsets: TokenOffsets, substring: str, occurrence: int = 0) -> list[int]:
    """Token positions whose (non-empty) characters overlap the occurrence of ``substring``."""
    start, end = find_occurrence(offsets.text, substring, occurrence)
    positions = [i for i, (s, e) in enumerate(offsets.offsets) if s < e and s < end and e > start]
    if not positions:
        raise SpanError(f"span {substring!r} (occurrence {occurrence}) covers no token of the prompt")
    return positions


def parse_position(item: Any) -> int | Span:
    """One entry of a position list as JSON sends it: an integer, a Span, or {"span", "occurrence"}."""
    if isinstance(item, Span):
        return item
    if isinstance(item, bool) or not isinstance(item, (int, dict)):
        raise SpanError(f"a position must be an integer or {{\"span\": str, \"occurrence\": int}}, got {item!r}")
    if isinstance(item, int):
        return item
    unknown = set(item) - {"span", "occurrence"}
    if unknown or not isinstance(item.get("span"), str):
        raise SpanError(f"a span position is {{\"span\": str, \"occurrence\": int}}, got {item!r}")
    occurrence = item.get("occurrence", 0)
    if isinstance(occurrence, bool) or not isinstance(occurrence, int):
        raise SpanError(f"span {item['span']!r}: occurrence must be an integer, got {occurrence!r}")
    return Span(item["span"], occurrence)


def dedup_positions(positions: Iterable[int]) -> list[int]:
    """``positions`` in order, each kept at its first appearance."""
    seen: set[int] = set()
    out: list[int] = []
    for position in positions:
        if position not in seen:
            seen.add(position)
            out.append(position)
    return out


def resolve_positions(items: Any, offsets: TokenOffsets) -> list[int]:
    """The integer position axis for ``items``: ``"all_prompt"`` (every token), or a list of integers
    and spans, expanded in order without duplicates. Integers must index the prompt."""
    count = len(offsets.offsets)
    if items == ALL_PROMPT:
        return list(range(count))
    if isinstance(items, (str, bytes)) or not isinstance(items, (list, tuple)):
        raise SpanError(f"positions must be a list or {ALL_PROMPT!r}, got {items!r}")
    if not items:
        raise SpanError("positions is empty")
    expanded: list[int] = []
    for item in items:
        parsed = parse_position(item)
        if isinstance(parsed, Span):
            expanded += span_positions(offsets, parsed.text, parsed.occurrence)
        elif not 0 <= parsed < count:
            raise SpanError(f"position {parsed} out of range: the prompt has {count} tokens (0..{count - 1})")
        else:
            expanded.append(parsed)
    return dedup_positions(expanded)
