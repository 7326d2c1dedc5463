"""Prefix splice: a chat prompt that starts with the exact ids of the conversation's earlier part.

A multi-turn RL rollout sends the whole conversation as ``messages`` each turn, plus the ids the
policy actually saw and produced so far (the previous response's ``prompt_token_ids + token_ids``).
Re-rendering earlier turns with the chat template and re-tokenizing them loses those ids: BPE splits
change, templates drop earlier reasoning or re-serialize tool calls. The splice keeps the prefix ids
as they are and appends only what the template puts after them. Engine-free (standard library
only): each engine's runtime hands in its own rendering and tokenizer.

How the rest is found, cheapest first:

1. the templated prompt already starts with the prefix ids: it is the prompt, unchanged;
2. the prefix's text is a prefix of the templated text (only the tokenization drifted): the prefix
   ids, then the rest of the templated text tokenized;
3. otherwise the template rewrote earlier turns (dropped reasoning, re-serialized a tool call): the
   conversation is rendered again with the last assistant message replaced by a marker, and what
   the template puts after that message (its end-of-turn separators, the new messages, the
   generation prompt) follows the prefix; end-of-turn ids the prefix already ends with (the
   generated end-of-turn token) are not repeated. Before that, the text of every earlier system,
   user and tool message must be found in the prefix's text, in order (assistant messages are the
   parsers' view of generated text, not a copy of it); where one is missing, the request is refused
   with a message that says where the prefix and the conversation part.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

# The last assistant message's content in the marker rendering: characters no template rewrites and
# no tokenizer merges across (invisible separators around a plain word).
MARKER = "\u2063toolkit-splice-point\u2063"
CONTEXT = 24  # characters of text shown on each side of a parting point


class SpliceError(ValueError):
    """The prefix cannot be spliced into the conversation (the request gets a 400)."""

    def __init__(self, message: str, parameter: str) -> None:
        super().__init__(message)
        self.parameter = parameter


@dataclass
class Template:
    """One request's chat template and tokenizer, as the engine renders them.

    ``render(messages, add_generation_prompt)`` is the template's text for ``messages`` with the
    request's own options (tools, template kwargs) and the given ``add_generation_prompt``
    (``None``: the request's own, with its ``continue_final_message``).
    """

    render: Callable[[list, "bool | None"], str]
    encode: Callable[[str], list[int]]
    decode: Callable[[Sequence[int]], str]


@dataclass
class Splice:
    prompt: list[int]
    how: str  # "unchanged", "text", "template"
    text: str  # the prompt's text (what the engine logs and reports as the prompt)


def _get(message: Any, key: str) -> Any:
    if isinstance(message, dict):
        return message.get(key)
    return getattr(message, key, None)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            text = _get(part, "text")
            if isinstance(text, str):
                parts.append(text)
        return "".join(parts)
    return ""


def message_texts(message: Any) -> list[str]:
    """The texts of a message that any rendering of it contains: the content of a system, user or
    tool message. An assistant message's fields are what the server's parsers made of the generated
    text (markers removed, tool calls re-serialized), not a part of it: they are not looked for."""
    if _get(message, "role") == "assistant":
        return []
    content = _text_of(_get(message, "content")).strip()
    return [content] if content else []


def last_assistant(messages: Sequence[Any]) -> int | None:
    for position in range(len(messages) - 1, -1, -1):
        if _get(messages[position], "role") == "assistant":
            return position
    return None


def _around(text: str, position: int) -> str:
    return repr(text[max(0, position - CONTEXT): position + CONTEXT])


def parting_point(prefix: Sequence[int], rendered: Sequence[int]) -> int:
    """The first position where the prefix ids and the templated ids differ."""
    for position, (a, b) in enumerate(zip(prefix, rendered)):
        if a != b:
            return position
    return min(len(prefix), len(rendered))


def check_covers(prefix_text: str, messages: Sequence[Any], upto: int, field: str) -> None:
    """Every text of ``messages[:upto + 1]`` is in the prefix's text, in order; else a SpliceError
    naming the first message that is not and the point of the prefix text where the search stopped."""
    cursor = 0
    for index in range(upto + 1):
        for text in message_texts(messages[index]):
            found = prefix_text.find(text, cursor)
            if found < 0:
                raise SpliceError(
                    f"`{field}` is not the start of this conversation: messages[{index}] "
                    f"({_get(messages[index], 'role')}) {text[:40]!r} is not in the prefix's text after "
                    f"character {cursor} (prefix text there: {_around(prefix_text, cursor)})",
                    field,
                )
            cursor = found + len(text)


def splice(prefix: Sequence[int], rendered: Sequence[int], rendered_text: str, messages: Sequence[Any],
           template: Template, field: str = "prefix_token_ids") -> Splice:
    """The prompt: ``prefix`` exactly, then what the template puts after it (module docstring)."""
    prefix = list(prefix)
    if list(rendered[: len(prefix)]) == prefix:
        return Splice(list(rendered), "unchanged", rendered_text)
    prefix_text = template.decode(prefix)
    if rendered_text.startswith(prefix_text):
        return Splice(prefix + template.encode(rendered_text[len(prefix_text):]), "text", rendered_text)

    at = parting_point(prefix, rendered)
    where = (f"they part at token {at} (prefix {prefix[at:at + 3]}..., templated {list(rendered[at:at + 3])}...; "
             f"prefix text {_around(prefix_text, len(template.decode(prefix[:at])))})")
    k = last_assistant(messages)
    if k is None:
        raise SpliceError(
            f"`{field}` is not the start of the templated conversation and `messages` has no assistant "
            f"message to splice after: {where}", field)
    check_covers(prefix_text, messages, k, field)

    marked = [*messages[:k], {"role": "assistant", "content": MARKER}, *messages[k + 1:]]
    text = template.render(marked, None)
    head = template.render(marked[: k + 1], False)
    if text.count(MARKER) != 1 or head.count(MARKER) != 1:
        raise SpliceError(
            f"`{field}` cannot be spliced: the chat template does not render the last assistant message's "
            f"content once ({where})", field)
    after = text[text.index(MARKER) + len(MARKER):]
    close = template.encode(head[head.index(MARKER) + len(MARKER):])  # e.g. <|im_end|> \n
    rest = template.encode(after)
    # The prefix ends with the generated end-of-turn id(s), which the template also writes: keep one.
    overlap = 0
    for size in range(min(len(close), len(rest), len(prefix)), 0, -1):
        if rest[:size] == close[:size] and prefix[-size:] == rest[:size]:
            overlap = size
            break
    return Splice(prefix + rest[overlap:], "template", prefix_text + template.decode(rest[overlap:]))


def tokenizer_codec(tokenizer: Any) -> tuple[Callable[[str], list[int]], Callable[[Sequence[int]], str]]:
    """``(encode, decode)`` of a Hugging Face tokenizer as the splice needs them: no special tokens
    added, special tokens kept in text, no clean-up of spaces. A fast tokenizer's Rust backend is
    called directly (the same ids and text, without the Python wrapper's cost per call)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        return (lambda text: backend.encode(text, add_special_tokens=False).ids,
                lambda ids: backend.decode(list(ids), skip_special_tokens=False))

    def decode(ids: Sequence[int]) -> str:
        try:
            return tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        except TypeError:  # a tokenizer without the Hugging Face keywords
            return tokenizer.decode(list(ids), skip_special_tokens=False)

    return (lambda text: list(tokenizer.encode(text, add_special_tokens=False)), decode)


# --------------------------------------------------------------------------------------------------
# request fields


def prefix_from_messages(messages: Any) -> list[int] | None:
    """NeMo-Gym's convention: the last assistant message that carries ``prompt_token_ids`` and
    ``generation_token_ids`` gives the prefix (the ids of that turn's prompt and generation)."""
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "assistant" \
                and isinstance(message.get("prompt_token_ids"), list):
            generated = message.get("generation_token_ids")
            return list(message["prompt_token_ids"]) + list(generated if isinstance(generated, list) else [])
    return None


def normalize_token_fields(data: dict, check_ids: Callable[[Any, str], list[int]],
                           error: Callable[[str, str], Exception]) -> None:
    """Peers' field names onto ours, in a raw chat request body: verifiers' ``tokens`` is
    ``input_ids``; NeMo-RL's ``required_prefix_token_ids`` and NeMo-Gym's ids on the last assistant
    message are ``prefix_token_ids``. ``check_ids(value, field)`` type-checks a list of ids, and runs
    here once for each ids field of the request (``input_ids`` under whichever name it came);
    ``error(message, field)`` is the engine's 400. Conflicting fields are refused."""
    if data.get("tokens") is not None:
        if data.get("input_ids") is not None:
            raise error("send the prompt ids once: `tokens` and `input_ids` are the same field", "tokens")
        data["input_ids"] = check_ids(data.pop("tokens"), "tokens")
    elif data.get("input_ids") is not None:
        check_ids(data["input_ids"], "input_ids")
    required = data.pop("required_prefix_token_ids", None)
    if required is not None:
        if data.get("prefix_token_ids") is not None and data["prefix_token_ids"] != required:
            raise error("`prefix_token_ids` and `required_prefix_token_ids` differ: send one of them",
                        "prefix_token_ids")
        data["prefix_token_ids"] = required
    if data.get("prefix_token_ids") is None and data.get("input_ids") is None:
        from_messages = prefix_from_messages(data.get("messages"))
        if from_messages is not None:
            data["prefix_token_ids"] = from_messages
    if data.get("prefix_token_ids") is not None:
        check_ids(data["prefix_token_ids"], "prefix_token_ids")
        if data.get("input_ids") is not None:
            raise error("`prefix_token_ids` cannot be used with `input_ids`: `input_ids` is the whole prompt",
                        "prefix_token_ids")
        if not data.get("messages"):
            raise error("`prefix_token_ids` needs `messages`: the conversation the prefix starts", "prefix_token_ids")
