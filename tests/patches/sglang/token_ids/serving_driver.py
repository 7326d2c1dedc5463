"""Drive SGLang's real ``OpenAIServingChat`` with a scripted tokenizer manager; hand back JSON (tests/harness/channel.py).

    <sglang venv python> serving_driver.py MODEL_DIR [--server-wide-too]

Run by test_serving.py in an SGLang venv of every group, patched or not; not a test module. The
real pieces: ``OpenAIServingChat``, ``ServerArgs``, ``TemplateManager``, the model's tokenizer and
chat template, SGLang's tool-call and reasoning parsers. The tokenizer manager is a stand-in whose
``generate_request`` yields the output dicts the real one does (``{"text", "output_ids",
"meta_info", "index"}``): cumulative, or incremental as with 0.5.9's ``--stream-output`` (ids only)
and 0.5.23's ``--incremental-streaming-output`` (text and ids). Each scripted completion is real
token ids of the tiny model's tokenizer, given a few ids per engine output, ending with EOS.

Prints one JSON object: for every case (scenario x request kind x output mode) the response body
(non-streaming) or the list of SSE chunks (streaming), plus the chat template's prompt ids and each
scripted completion, so the test can check ids against text.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.metadata
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

from packaging.version import Version

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo, for the result channel
from tests.harness.channel import write_result  # noqa: E402

VERSION = Version(importlib.metadata.version("sglang"))

import sglang.srt.managers.tokenizer_manager as tokenizer_manager_module  # noqa: E402
from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest  # noqa: E402
from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402
from transformers import AutoTokenizer  # noqa: E402

try:  # 0.5.16+
    from sglang.srt.parser.template_manager import TemplateManager
except ImportError:
    from sglang.srt.managers.template_manager import TemplateManager
try:  # 0.5.14+: the serving layer reads its config from a process-wide runtime context
    from sglang.srt.runtime_context import publish
except ImportError:
    publish = None

# What the release does, by what it has rather than by its number (every release 0.5.9-0.5.23 runs this):
FEATURES = {
    # 0.5.10+ (renamed from 0.5.9's --stream-output): an incremental stream sends only the new text,
    # not only the new ids
    # (0.5.9's ServerArgs is the dataclass with stream_output; 0.5.22+'s is no dataclass)
    "text_deltas": "stream_output" not in {f.name for f in dataclasses.fields(ServerArgs)}
    if dataclasses.is_dataclass(ServerArgs) else True,
    # 0.5.11+: ... and only the new output logprobs
    "logprob_deltas": hasattr(tokenizer_manager_module, "_slice_streaming_output_meta_info"),
    # 0.5.13+: its own return_prompt_token_ids (non-streaming; a stream asking for it gets a 400)
    "own_prompt_token_ids": "return_prompt_token_ids" in ChatCompletionRequest.model_fields,
    # 0.5.17+: its own return_token_ids on chat (non-streaming; a stream asking for it gets a 400)
    "own_token_ids": "return_token_ids" in ChatCompletionRequest.model_fields,
    # 0.5.13+: its own input_ids on chat requests (messages still required)
    "native_input_ids": "input_ids" in ChatCompletionRequest.model_fields,
    # 0.5.21+: every logprob entry built from the engine's raw triples by one method
    "raw_logprobs": hasattr(OpenAIServingChat, "_build_token_logprobs_from_raw"),
}
INCREMENTAL_FLAG = "incremental_streaming_output" if FEATURES["text_deltas"] else "stream_output"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
TOOL_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'

# name -> (server's parsers, request extras, completions per choice, ids per engine output)
SCENARIOS = {
    "plain": ({}, {}, ["Hello there, general Kenobi! It is a fine day."], [1, 2, 3]),
    "tool_call": (
        {"tool_call_parser": "hermes"},
        {"tools": TOOLS},
        ["Let me check that.\n" + TOOL_CALL],
        [1, 2],
    ),
    "reasoning_then_tool_call": (
        {"tool_call_parser": "hermes", "reasoning_parser": "qwen3"},
        {"tools": TOOLS},
        ["<think>The user wants weather.</think>Checking.\n" + TOOL_CALL],
        [2, 1],
    ),
    "n2": ({}, {"n": 2}, ["First answer here, friend.", "Second one, with more words than the first."], [2, 3]),
}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


class ScriptedTokenizerManager:
    """Yields SGLang's output dicts for the scripted completions of the current request."""

    def __init__(self, server_args, tokenizer, incremental: bool) -> None:
        self.server_args = server_args
        self.tokenizer = tokenizer
        self.processor = None
        self.request_logger = SimpleNamespace(log_requests=False, log_requests_level=0)
        self.incremental_streaming_output = incremental  # 0.5.23's manager keeps its flag here
        self.incremental = incremental
        hf_config = SimpleNamespace(model_type="llama", architectures=["LlamaForCausalLM"])
        config = json.loads((Path(server_args.model_path) / "config.json").read_text())
        self.context_len = config["max_position_embeddings"]
        self.model_config = SimpleNamespace(
            is_multimodal=False, hf_config=hf_config, get_default_sampling_params=lambda: {},
            vocab_size=config["vocab_size"], context_len=self.context_len,
        )
        self.completions: list[list[int]] = []
        self.step_sizes: list[int] = [1]
        self.requests: list = []  # every GenerateReqInput received, as the engine would get it

    def create_abort_task(self, obj):
        return None

    def config_value(self, name: str):  # 0.5.23 reads its config through the manager
        from sglang.srt.runtime_context import get_context

        return get_context().config_leaf(name)

    def _text(self, ids: list[int]) -> str:
        # The detokenizer drops the matched EOS from the text; ids keep it.
        return self.tokenizer.decode([t for t in ids if t != self.tokenizer.eos_token_id])

    def _logprob(self, position: int, token: int) -> tuple[float, int, str]:
        """A made-up logprob triple ``(logprob, id, text)``, as SGLang's meta_info holds them."""
        return (-0.25 - position / 64, token, self.tokenizer.decode([token]))

    def _logprobs(self, obj, prompt: list[int], ids: list[int], start: int) -> dict:
        """SGLang's logprob entries of meta_info for output ids ``ids[start:]`` (and the prompt when
        ``logprob_start_len`` >= 0): tops are the sampled id and the next id of the vocabulary."""
        if not getattr(obj, "return_logprob", False):
            return {}
        top = getattr(obj, "top_logprobs_num", 0) or 0
        vocab = self.model_config.vocab_size

        def tops(position: int, token: int) -> list:
            row = [self._logprob(position, token), self._logprob(position + 1, (token + 1) % vocab)]
            return row[:top]

        meta = {"output_token_logprobs": [self._logprob(i, t) for i, t in enumerate(ids) if i >= start],
                "output_token_logprobs_length": len(ids)}  # 0.5.23 reads the count so far here
        if top:
            meta["output_top_logprobs"] = [tops(i, t) for i, t in enumerate(ids) if i >= start]
        logprob_start = getattr(obj, "logprob_start_len", -1)
        if logprob_start is not None and logprob_start >= 0:
            # position 0 has no logprob; SGLang sends None there
            meta["input_token_logprobs"] = [
                (None if i == 0 else self._logprob(i, t)[0], t, self.tokenizer.decode([t]))
                for i, t in enumerate(prompt) if i >= logprob_start
            ]
            if top:
                meta["input_top_logprobs"] = [None if i == 0 else tops(i, t)
                                              for i, t in enumerate(prompt) if i >= logprob_start]
        return meta

    async def generate_request(self, obj, request=None):
        """Non-streaming: one final output per choice (a list when n > 1). Streaming: the choices'
        outputs interleaved, a few ids each, as the real manager yields them."""
        self.requests.append(obj)
        prompt = obj.input_ids[0] if isinstance(obj.input_ids[0], list) else obj.input_ids  # n > 1 expands it

        def output(index: int, sent: int, text: str, output_ids: list[int], before: int = 0) -> dict:
            finished = sent == len(self.completions[index])
            # logprobs are cumulative, except in incremental streams of releases that slice them
            logprobs = self._logprobs(obj, list(prompt), self.completions[index][:sent],
                                      before if self.incremental and FEATURES["logprob_deltas"] else 0)
            out = {
                "text": text,
                "output_ids": output_ids,
                "meta_info": {
                    "id": "chatcmpl-fixed",
                    "finish_reason": {"type": "stop", "matched": self.tokenizer.eos_token_id} if finished else None,
                    "prompt_tokens": len(prompt),
                    "completion_tokens": sent,
                    "cached_tokens": 0,
                    "weight_version": "default",
                    "total_retractions": 0,
                    **logprobs,
                },
                "index": index,
            }
            if getattr(obj, "return_prompt_token_ids", False):  # 0.5.23's flag
                out["prompt_token_ids"] = list(prompt)
            return out

        if not obj.stream:
            outputs = [output(i, len(ids), self._text(ids), list(ids)) for i, ids in enumerate(self.completions)]
            yield outputs if len(outputs) > 1 else outputs[0]
            return
        sent = [0] * len(self.completions)
        step = 0
        while any(sent[i] < len(ids) for i, ids in enumerate(self.completions)):
            for index, ids in enumerate(self.completions):
                if sent[index] == len(ids):
                    continue
                before = sent[index]
                after = sent[index] = min(before + self.step_sizes[step % len(self.step_sizes)], len(ids))
                step += 1
                text = self._text(ids[:after])
                if self.incremental and FEATURES["text_deltas"]:  # only the new text too; 0.5.9: all of it
                    text = text[len(self._text(ids[:before])):]
                new_ids = list(ids[before:after]) if self.incremental else list(ids[:after])
                await asyncio.sleep(0)
                yield output(index, after, text, new_ids, before)


def serving_for(model: str, tokenizer, parsers: dict, incremental: bool) -> OpenAIServingChat:
    kwargs = dict(model_path=model, device="cpu", **parsers)
    kwargs[INCREMENTAL_FLAG] = incremental
    server_args = ServerArgs(**kwargs)
    if publish is not None:
        publish(server_args, role="test")
    manager = ScriptedTokenizerManager(server_args, tokenizer, incremental)
    templates = TemplateManager()
    templates.initialize_templates(manager, model_path=model)
    return OpenAIServingChat(manager, templates)


async def run_case(serving: OpenAIServingChat, body: dict):
    request = ChatCompletionRequest(**body)
    response = await serving.handle_request(request, None)
    if hasattr(response, "body_iterator"):  # StreamingResponse
        return {"status": 200, "chunks": [chunk async for chunk in response.body_iterator]}
    if hasattr(response, "model_dump_json"):
        return {"status": 200, "body": response.model_dump_json(by_alias=True)}
    return {"status": response.status_code, "body": bytes(response.body).decode()}


SERVER_WIDE = "TOOLKIT_RETURN_TOKEN_IDS"


async def main(model: str, server_wide_too: bool = False) -> dict:
    """Every case; with ``server_wide_too``, the vanilla cases once more under ``TOOLKIT_RETURN_TOKEN_IDS=1``
    (the runtime reads it per request), as ``result["server_wide"]["cases"]``: no second SGLang import."""
    tokenizer = AutoTokenizer.from_pretrained(model)
    result = await run_cases(model, tokenizer, (("vanilla", {}), ("ids", {"return_token_ids": True})))
    if server_wide_too:
        os.environ[SERVER_WIDE] = "1"
        try:
            result["server_wide"] = await run_cases(model, tokenizer, (("vanilla", {}),), own_flags=False)
        finally:
            del os.environ[SERVER_WIDE]
    return result


async def run_cases(model: str, tokenizer, kinds, own_flags: bool = True) -> dict:
    result: dict = {
        "version": str(VERSION),
        "features": FEATURES,
        "env": os.environ.get(SERVER_WIDE),
        "eos": tokenizer.eos_token_id,
        "prompt_ids": {},
        "completions": {},
        "cases": {},
    }
    for mode in ("cumulative", "incremental"):
        for name, (parsers, extra, texts, step_sizes) in SCENARIOS.items():
            serving = serving_for(model, tokenizer, parsers, mode == "incremental")
            manager = serving.tokenizer_manager
            manager.completions = [tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
                                   for text in texts]
            manager.step_sizes = step_sizes
            result["completions"][name] = manager.completions
            # The template renders the tools as the validated request holds them (SGLang's dumps).
            tools = ChatCompletionRequest(messages=MESSAGES, **extra).tools
            result["prompt_ids"][name] = list(
                tokenizer.apply_chat_template(MESSAGES, tools=[t.model_dump() for t in tools] if tools else None,
                                              add_generation_prompt=True, tokenize=True, return_dict=False)
            )
            for kind, flags in kinds:
                for stream in (False, True):
                    body = {"model": "tiny", "messages": MESSAGES, "temperature": 0, "max_tokens": 64,
                            "stream": stream, **extra, **flags}
                    key = f"{name}/{kind}/{'stream' if stream else 'nonstream'}/{mode}"
                    result["cases"][key] = await run_case(serving, body)
    if own_flags and FEATURES["own_prompt_token_ids"]:  # the release's own flags, non-streaming, and its 400 for a stream
        serving = serving_for(model, tokenizer, {}, False)
        manager = serving.tokenizer_manager
        manager.completions = [tokenizer.encode("Own flags.", add_special_tokens=False) + [tokenizer.eos_token_id]]
        result["completions"]["own_flags"] = manager.completions
        base = {"model": "tiny", "messages": MESSAGES, "temperature": 0, "max_tokens": 64}
        for key, extra in {
            "return_prompt_token_ids": {"return_prompt_token_ids": True},
            "return_token_ids": {"return_token_ids": True},
            "stream_return_prompt_token_ids": {"return_prompt_token_ids": True, "stream": True},
        }.items():
            result["cases"][f"own_flags/{key}"] = await run_case(serving, {**base, **extra})
    return result


if __name__ == "__main__":
    write_result(asyncio.run(main(sys.argv[1], server_wide_too="--server-wide-too" in sys.argv[2:])))
