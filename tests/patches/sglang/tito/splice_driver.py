"""Drive SGLang's real ``OpenAIServingChat`` through two-turn conversations with ``prefix_token_ids``;
hand back JSON (tests/harness/channel.py).

    <sglang venv python> splice_driver.py MODEL_DIR

Run by test_splice.py in an SGLang venv (0.5.9 or 0.5.23) with token-ids and tito applied; not a
test module. The real serving class, ``TemplateManager``, tokenizer and parsers (hermes, qwen3) of
the token-ids driver, with the tokenizer's chat template set to each template of
tests/patches/common/chat_templates.py. Turn one is answered by the scripted tokenizer manager with a
completion split into single-character ids (how a sampler may write a word, never how the tokenizer
would) ending in EOS; turn two sends the conversation, the parsed reply appended, with turn one's
``prompt_token_ids + token_ids``. For each case: both responses, and the prompt the engine got.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo

import pydantic
from transformers import AutoTokenizer

from tests.patches.common.chat_templates import TEMPLATES
from tests.patches.sglang.token_ids.serving_driver import (
    TOOLS,
    VERSION,
    ChatCompletionRequest,
    run_case,
    serving_for,
)

PARSERS = {"tool_call_parser": "hermes", "reasoning_parser": "qwen3"}
Q1 = {"role": "user", "content": "Name three prime numbers."}
Q2 = {"role": "user", "content": "And the next three?"}
OTHER = {"role": "user", "content": "Name three colours."}
ANSWER = "2, 3 and 5 are prime."
REASONED = "<think>\nsmall primes\n</think>\n\n2, 3 and 5."
# Reasoning first: 0.5.9's qwen3 parser reads a reply as reasoning until </think>.
TOOL_CALL = '<think>\nweather\n</think>\n\n<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>'


def split_ids(tokenizer, text: str) -> list[int]:
    """``text`` as single-character ids where a token has several characters (markers kept whole)."""
    ids = []
    for token in tokenizer.tokenize(text):
        if len(token) > 1 and not token.startswith("<"):
            ids += [tokenizer.convert_tokens_to_ids(ch) for ch in token]
        else:
            ids.append(tokenizer.convert_tokens_to_ids(token))
    assert tokenizer.decode(ids) == text
    return ids


def parsed(payload: dict) -> tuple[list[int], dict]:
    """Turn one's ids and the assistant message a client appends (from a non-streaming body)."""
    choice = payload["choices"][0]
    message = {"role": "assistant", "content": choice["message"].get("content") or ""}
    if choice["message"].get("reasoning_content"):
        message["reasoning_content"] = choice["message"]["reasoning_content"]
    if choice["message"].get("tool_calls"):
        message["tool_calls"] = [{"id": c["id"], "type": "function", "function": c["function"]}
                                 for c in choice["message"]["tool_calls"]]
    return payload["prompt_token_ids"] + choice["token_ids"], message


async def two_turns(serving, tokenizer, reply_ids: list[int], second: dict, first_extra: dict | None = None,
                    conversation=None, gym: bool = False, eos: bool = True) -> dict:
    """Turn one (``[Q1]``, scripted reply), then turn two: ``second`` merged into a body whose
    messages are ``conversation(message)`` (default ``[Q1, message, Q2]``) and whose prefix is turn
    one's ids."""
    import json

    manager = serving.tokenizer_manager
    base = {"model": "tiny", "temperature": 0, "max_tokens": 16, **(first_extra or {})}
    manager.completions = [reply_ids + ([tokenizer.eos_token_id] if eos else [])]
    first = await run_case(serving, {**base, "messages": [Q1], "return_token_ids": True})
    payload = json.loads(first["body"])
    prefix, message = parsed(payload)
    if gym:  # NeMo-Gym's convention: the turn's ids ride on the assistant message
        message = dict(message, prompt_token_ids=payload["prompt_token_ids"],
                       generation_token_ids=payload["choices"][0]["token_ids"])
    second = {k: (prefix if v == "FROM_PREFIX" else v) for k, v in second.items()}
    messages = conversation(message) if conversation else [Q1, message, Q2]
    manager.requests.clear()
    manager.completions = [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
                           for text in (" Seven.", " Eleven.")[: second.get("n") or 1]]
    body = {**base, "messages": messages, "prefix_token_ids": prefix, **second}
    body = {k: v for k, v in body.items() if v is not None}
    try:
        ChatCompletionRequest(**body)
    except pydantic.ValidationError as error:
        return {"status": 400, "validation": str(error)}
    result = await run_case(serving, body)
    result.update(prefix=prefix, messages=messages,
                  stop=[(r.sampling_params or {}).get("stop") for r in manager.requests],
                  engine=[list(r.input_ids[0] if isinstance(r.input_ids[0], list) else r.input_ids)
                          for r in manager.requests])
    return result


async def main(model: str) -> dict:
    out: dict = {"version": str(VERSION), "cases": {}}
    for name, template in TEMPLATES.items():
        tokenizer = AutoTokenizer.from_pretrained(model)
        tokenizer.chat_template = template
        serving = serving_for(model, tokenizer, PARSERS, False)
        cases = out["cases"]
        answer = split_ids(tokenizer, ANSWER)
        for stream in (False, True):
            s = "stream" if stream else "nonstream"
            cases[f"{name}/drift/{s}"] = await two_turns(serving, tokenizer, answer, {"stream": stream})
            cases[f"{name}/n2_stop/{s}"] = await two_turns(serving, tokenizer, answer,
                                                           {"stream": stream, "n": 2, "stop": ["Seven"]})
        plain_reply = tokenizer.encode("<tool_call><think>", add_special_tokens=False)
        # No change: the reply (cut by max_tokens: no EOS) re-tokenizes to itself and is sent back as
        # plain content.
        cases[f"{name}/unchanged"] = await two_turns(
            serving, tokenizer, plain_reply, {}, eos=False,
            conversation=lambda m: [Q1, {"role": "assistant", "content": "<tool_call><think>"}, Q2])
        cases[f"{name}/plain_of_unchanged"] = await two_turns(
            serving, tokenizer, plain_reply, {"prefix_token_ids": None}, eos=False,
            conversation=lambda m: [Q1, {"role": "assistant", "content": "<tool_call><think>"}, Q2])
        cases[f"{name}/reasoning"] = await two_turns(serving, tokenizer, split_ids(tokenizer, REASONED), {})
        result = {"role": "tool", "tool_call_id": "call_0", "content": "sunny, 21 C"}
        cases[f"{name}/tool_call"] = await two_turns(
            serving, tokenizer, split_ids(tokenizer, TOOL_CALL), {"tools": TOOLS}, {"tools": TOOLS},
            conversation=lambda m: [Q1, m, dict(result, tool_call_id=m["tool_calls"][0]["id"])])
        cases[f"{name}/mismatch"] = await two_turns(serving, tokenizer, answer, {},
                                                    conversation=lambda m: [OTHER, m, Q2])
        cases[f"{name}/required_prefix"] = await two_turns(
            serving, tokenizer, answer, {"prefix_token_ids": None, "required_prefix_token_ids": "FROM_PREFIX"})
        cases[f"{name}/nemo_gym"] = await two_turns(serving, tokenizer, answer, {"prefix_token_ids": None}, gym=True)
        cases[f"{name}/tokens"] = await two_turns(
            serving, tokenizer, answer, {"prefix_token_ids": None, "tokens": "FROM_PREFIX"})
    return out


if __name__ == "__main__":
    from tests.harness.channel import write_result

    write_result(asyncio.run(main(sys.argv[1])))
