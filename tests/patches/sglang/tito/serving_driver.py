"""Drive SGLang's real ``OpenAIServingChat`` with TITO requests; hand back JSON (tests/harness/channel.py).

    <sglang venv python> serving_driver.py MODEL_DIR

Run by test_serving.py in an SGLang venv of every group, patched or not; not a test module. It
reuses the token-ids driver's pieces (``tests/patches/sglang/token_ids/serving_driver.py``): the real
``OpenAIServingChat``, ``ServerArgs``, ``TemplateManager``, tokenizer, chat template and parsers,
and the scripted tokenizer manager, which records every engine request it gets and gives SGLang's
logprob triples when asked. For each case: the response (body or SSE chunks), or the 400 a request
body fails validation with (what SGLang's HTTP handler answers for a pydantic error), and what the
engine was asked (prompt ids, stop strings, logprob settings).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo, for the token-ids driver

import pydantic
from transformers import AutoTokenizer

from tests.patches.sglang.token_ids.serving_driver import (
    MESSAGES,
    FEATURES,
    SCENARIOS,
    VERSION,
    ChatCompletionRequest,
    run_case,
    serving_for,
)

CUSTOM_IDS = [5, 6, 7, 8, 9, 10, 11]  # not what the template gives: the prompt must still be these


def engine_view(obj) -> dict:
    """What the scripted tokenizer manager got: the fields TITO decides."""
    ids = obj.input_ids
    if ids and isinstance(ids[0], list):
        ids = ids[0]
    params = obj.sampling_params or {}
    return {
        "input_ids": list(ids) if ids is not None else None,
        "text": obj.text,
        "stop": params.get("stop"),
        "stop_token_ids": params.get("stop_token_ids"),
        "max_new_tokens": params.get("max_new_tokens"),
        "n": params.get("n"),
        "return_logprob": obj.return_logprob,
        "logprob_start_len": obj.logprob_start_len,
        "top_logprobs_num": obj.top_logprobs_num,
    }


async def case(serving, body: dict) -> dict:
    manager = serving.tokenizer_manager
    manager.requests.clear()
    try:
        ChatCompletionRequest(**body)
    except pydantic.ValidationError as error:
        return {"status": 400, "validation": str(error)}
    result = await run_case(serving, body)
    result["engine"] = [engine_view(obj) for obj in manager.requests]
    return result


def cases_for(template_ids: dict[str, list[int]], vocab: int, context: int) -> dict[str, tuple[str, dict, str]]:
    """name -> (scenario, request body, output mode)."""
    out: dict[str, tuple[str, dict, str]] = {}
    for scenario, (_, extra, _, _) in SCENARIOS.items():
        for stream in (False, True):
            s = "stream" if stream else "nonstream"
            base = {"model": "tiny", "temperature": 0, "max_tokens": 64, "stream": stream, **extra}
            out[f"{scenario}/messages/{s}"] = (scenario, {**base, "messages": MESSAGES}, "cumulative")
            out[f"{scenario}/messages_ids/{s}"] = (scenario, {**base, "messages": MESSAGES, "return_token_ids": True},
                                                   "cumulative")
            out[f"{scenario}/input_ids/{s}"] = (
                scenario, {**base, "messages": MESSAGES, "input_ids": template_ids[scenario]}, "cumulative")
            out[f"{scenario}/input_ids_only/{s}"] = (
                scenario, {**base, "messages": [], "input_ids": template_ids[scenario]}, "cumulative")
            out[f"{scenario}/no_messages/{s}"] = (scenario, {**base, "input_ids": CUSTOM_IDS}, "cumulative")
            out[f"{scenario}/custom_ids/{s}"] = (
                scenario, {**base, "messages": MESSAGES, "input_ids": CUSTOM_IDS}, "cumulative")
            sampling = {"stop": ["general", "fine"], "stop_token_ids": [13], "max_tokens": 7}
            out[f"{scenario}/sampling/{s}"] = (scenario, {**base, "input_ids": CUSTOM_IDS, **sampling}, "cumulative")
            for mode in ("cumulative", "incremental"):
                out[f"{scenario}/logprobs/{s}/{mode}"] = (
                    scenario, {**base, "input_ids": CUSTOM_IDS, "logprobs": True, "top_logprobs": 2}, mode)
                out[f"{scenario}/messages_logprobs/{s}/{mode}"] = (
                    scenario, {**base, "messages": MESSAGES, "logprobs": True, "top_logprobs": 2}, mode)
    plain = {"model": "tiny", "temperature": 0, "max_tokens": 8}
    out["start/input_ids/3"] = ("plain", {**plain, "input_ids": CUSTOM_IDS, "logprob_start_len": 3}, "cumulative")
    out["start/input_ids/0_top"] = ("plain", {**plain, "input_ids": CUSTOM_IDS, "logprob_start_len": 0,
                                              "logprobs": True, "top_logprobs": 2}, "cumulative")
    out["start/input_ids/-1"] = ("plain", {**plain, "input_ids": CUSTOM_IDS, "logprob_start_len": -1}, "cumulative")
    out["start/messages/2"] = ("plain", {**plain, "messages": MESSAGES, "logprob_start_len": 2}, "cumulative")
    out["start/n2/1"] = ("n2", {**plain, "input_ids": CUSTOM_IDS, "n": 2, "logprob_start_len": 1}, "cumulative")
    bad = {
        "str": {"input_ids": "1 2"},
        "item_str": {"input_ids": [1, "2"]},
        "item_float": {"input_ids": [2.0]},
        "item_bool": {"input_ids": [True]},
        "negative": {"input_ids": [5, -1]},
        "vocab": {"input_ids": [5, vocab]},
        "empty": {"input_ids": []},
        "too_long_for_max_tokens": {"input_ids": [5] * (context - 10), "max_tokens": 10},
        "too_long": {"input_ids": [5] * context, "max_tokens": None},
        "start_past_prompt": {"input_ids": CUSTOM_IDS, "logprob_start_len": len(CUSTOM_IDS)},
        "start_past_templated_prompt": {"messages": MESSAGES, "logprob_start_len": 100000},
        "start_negative": {"input_ids": CUSTOM_IDS, "logprob_start_len": -2},
        "start_str": {"input_ids": CUSTOM_IDS, "logprob_start_len": "3"},
        "start_stream": {"input_ids": CUSTOM_IDS, "logprob_start_len": 0, "stream": True},
    }
    for name, fields in bad.items():
        for stream in (False, True):
            body = {**plain, "stream": stream, **fields}
            out[f"bad/{name}/{'stream' if body['stream'] else 'nonstream'}"] = ("plain", body, "cumulative")
    return out


async def main(model: str) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(model)
    result: dict = {"version": str(VERSION), "features": FEATURES, "eos": tokenizer.eos_token_id, "template_ids": {}, "completions": {},
                    "custom_ids": CUSTOM_IDS, "cases": {}}
    for name, (parsers, extra, texts, _) in SCENARIOS.items():
        tools = ChatCompletionRequest(messages=MESSAGES, **extra).tools
        result["template_ids"][name] = list(tokenizer.apply_chat_template(
            MESSAGES, tools=[t.model_dump() for t in tools] if tools else None, add_generation_prompt=True,
            tokenize=True, return_dict=False))
        result["completions"][name] = [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
                                       for text in texts]
    probe = serving_for(model, tokenizer, {}, False).tokenizer_manager
    result["vocab"], result["context"] = probe.model_config.vocab_size, probe.context_len
    cases = cases_for(result["template_ids"], result["vocab"], result["context"])
    # One serving object per (scenario, mode), its cases run together: 0.5.23 reads the server
    # args that were published last.
    current, serving = None, None
    for key, (scenario, body, mode) in sorted(cases.items(), key=lambda item: (item[1][0], item[1][2])):
        parsers, _, _, step_sizes = SCENARIOS[scenario]
        if current != (scenario, mode):
            current, serving = (scenario, mode), serving_for(model, tokenizer, parsers, mode == "incremental")
        serving.tokenizer_manager.completions = result["completions"][scenario]
        serving.tokenizer_manager.step_sizes = step_sizes
        result["cases"][key] = await case(serving, {k: v for k, v in body.items() if v is not None})
    return result


if __name__ == "__main__":
    from tests.harness.channel import write_result

    write_result(asyncio.run(main(sys.argv[1])))
