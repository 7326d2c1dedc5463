"""Token ids and ``input_ids`` on vLLM's ``/v1/responses`` with the tito patch, over HTTP.

The tito session server (conftest.py: the tiny random model, qwen3 reasoning and hermes tool parsers,
TOOLKIT_RETURN_TOKEN_IDS=1) answers both APIs, so the Responses ids are checked against chat
completions' for the same conversation under greedy decoding. On vLLM 0.33.0 the server also runs
responses-stream, on 0.32.0 not: both compositions.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

A = [{"role": "user", "content": "Name three prime numbers."}]
B = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "def fibonacci(n):"}]


class Http:
    def __init__(self, server) -> None:
        self.model = server.model
        self.http = httpx.Client(base_url=server.base_url, timeout=120)

    def chat(self, messages: list, max_tokens: int = 10) -> dict:
        response = self.http.post("/v1/chat/completions", json={
            "model": self.model, "messages": messages, "max_tokens": max_tokens, "temperature": 0})
        assert response.status_code == 200, response.text
        return response.json()

    def responses(self, **body: Any) -> httpx.Response:
        return self.http.post("/v1/responses", json={"model": self.model, "temperature": 0,
                                                      "max_output_tokens": 10, **body})

    def stream(self, **body: Any) -> list[dict]:
        """Every event of a streamed response, in order."""
        body = {"model": self.model, "temperature": 0, "max_output_tokens": 10, "stream": True, **body}
        with self.http.stream("POST", "/v1/responses", json=body) as response:
            assert response.status_code == 200, response.read()
            return [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]


@pytest.fixture(scope="module")
def http(tito_server) -> Http:
    return Http(tito_server)


@pytest.mark.parametrize("messages", [A, B], ids=["A", "B"])
def test_responses_ids_equal_chat_ids(http, messages):
    """The same conversation, greedy: the same prompt ids and output ids as chat completions."""
    chat = http.chat(messages)
    response = http.responses(input=messages)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["prompt_token_ids"] == chat["prompt_token_ids"]
    assert body["token_ids"] == chat["choices"][0]["token_ids"]
    assert len(body["token_ids"]) == body["usage"]["output_tokens"]
    assert len(body["prompt_token_ids"]) == body["usage"]["input_tokens"]


def test_stream_completed_event_carries_the_same_ids(http, tito_server):
    plain = http.responses(input=B).json()
    events = http.stream(input=B)
    if "responses-stream" in tito_server.patches:  # the two patches compose: the stream stays well formed
        from toolkit.verify.grammar import check_events

        assert check_events(events) == []
    completed = [event for event in events if event["type"] in ("response.completed", "response.incomplete")]
    assert len(completed) == 1 and completed[0] is events[-1]
    final = completed[0]["response"]
    assert final["prompt_token_ids"] == plain["prompt_token_ids"]
    assert final["token_ids"] == plain["token_ids"] and final["token_ids"]


def test_return_token_ids_false_keeps_vllms_shape(http):
    """The server-wide switch is a default: a request can turn it off, and then no field is added."""
    body = http.responses(input=A, return_token_ids=False).json()
    assert "prompt_token_ids" not in body and "token_ids" not in body
    final = http.stream(input=A, return_token_ids=False)[-1]["response"]
    assert "prompt_token_ids" not in final and "token_ids" not in final


def test_input_ids_are_the_prompt(http):
    """``input_ids`` of B's templated prompt, with ``input`` A: the prompt is B's, and so is the output."""
    chat_b = http.chat(B)
    response = http.responses(input=A, input_ids=chat_b["prompt_token_ids"])
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["prompt_token_ids"] == chat_b["prompt_token_ids"]
    assert body["token_ids"] == chat_b["choices"][0]["token_ids"]
    final = http.stream(input_ids=chat_b["prompt_token_ids"])[-1]["response"]  # no `input` at all
    assert (final["prompt_token_ids"], final["token_ids"]) == (body["prompt_token_ids"], body["token_ids"])


@pytest.mark.parametrize("extra,field,words", [
    ({"input_ids": "1 2 3"}, "input_ids", "must be a list"),
    ({"input_ids": []}, "input_ids", "must not be empty"),
    ({"input_ids": [1, 2.5]}, "input_ids", "item 1 is float"),
    ({"input_ids": [1, -4]}, "input_ids", "negative ids: item 1 is -4"),
    ({"input_ids": [1, 10**9]}, "input_ids", "out of the vocabulary"),
    ({"input_ids": [1, 2], "previous_response_id": "resp_x"}, "previous_response_id", "cannot be used with `input_ids`"),
], ids=["not-a-list", "empty", "float", "negative", "out-of-vocab", "previous-response"])
def test_bad_input_ids_are_a_400_naming_the_field(http, extra, field, words):
    response = http.responses(input="hi", **extra)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert words in error["message"] and field in error["message"], error
    assert http.responses(input="hi", max_output_tokens=2).status_code == 200  # the server is still up


@pytest.mark.parametrize("length,max_output_tokens,words", [
    (100_000, 1, "exceeds"),  # vLLM's own check of the prompt
    (500, 100, "`input_ids` has 500 tokens and max_output_tokens is 100: 600 exceeds the model's context of 512"),
])
def test_input_ids_that_leave_no_room_are_a_400(http, length, max_output_tokens, words):
    """vLLM alone would clamp the output budget of the second silently (12 tokens, status incomplete)."""
    response = http.responses(input_ids=[1] * length, max_output_tokens=max_output_tokens)
    assert response.status_code == 400, response.text
    assert words in response.json()["error"]["message"]
    assert http.responses(input="hi", max_output_tokens=2).status_code == 200


RESPONSES_TOOLS = [{"type": "function", "name": "get_weather", "description": "Weather for a city.",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
CHAT_TOOLS = [{"type": "function", "function": {k: v for k, v in RESPONSES_TOOLS[0].items() if k != "type"}}]
# With a prompt that ends reasoning, this regex makes the tiny model write a hermes tool call.
TOOL_CALL_REGEX = r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "Paris"\}\}\n</tool_call>'


def test_tool_call_parsed_with_input_ids_streaming_and_not(http, tito_server):
    """``input_ids`` that end reasoning (<think></think>) and a forced hermes call: the tool parser reads
    the output as with ``input``, and the ids are chat's for the same prompt."""
    prompt = http.chat(A, max_tokens=1)["prompt_token_ids"] + [4094, 4095]
    forced = {"structured_outputs": {"regex": TOOL_CALL_REGEX}}
    chat = http.http.post("/v1/chat/completions", json={
        "model": http.model, "messages": A, "input_ids": prompt, "tools": CHAT_TOOLS, "max_tokens": 80,
        "temperature": 0, **forced}).json()
    body = {"input_ids": prompt, "tools": RESPONSES_TOOLS, "max_output_tokens": 80, **forced}
    plain = http.responses(**body).json()
    events = http.stream(**body)
    final = events[-1]["response"]
    for response in (plain, final):
        assert response["prompt_token_ids"] == prompt
        assert response["token_ids"] == chat["choices"][0]["token_ids"]
        calls = [item for item in response["output"] if item["type"] == "function_call"]
        assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"})]
    if "responses-stream" in tito_server.patches:
        from toolkit.verify.grammar import check_events

        assert check_events(events) == []


# --------------------------------------------------------------------------------------------------
# token ids per output item (docs/tito.md: each item gets the contiguous run of its ids, markers included)

THINK_END = 4095  # the tiny tokenizer's </think>
END_OF_TURN = "<|im_end|>"  # its end of turn (id 3), which /detokenize spells out


def detokenize(http: Http, ids: list[int]) -> str:
    response = http.http.post("/detokenize", json={"model": http.model, "tokens": ids})
    assert response.status_code == 200, response.text
    return response.json()["prompt"]


def check_item_ids(http: Http, response: dict) -> list[list[int]]:
    """Each output item's ``token_ids`` are a contiguous run of the turn's ``token_ids``, in item order,
    that decodes to the item (its text, or its call between the hermes markers); the ids between and
    after the runs decode to whitespace only, or the end-of-turn token. Returns the runs."""
    ids, position, runs, gaps = response["token_ids"], 0, [], []
    for item in response["output"]:
        run = item["token_ids"]
        assert run, item
        at = next((i for i in range(position, len(ids) - len(run) + 1) if ids[i:i + len(run)] == run), None)
        assert at is not None, (item["type"], run, ids[position:])
        gaps.append(ids[position:at])
        runs.append(run)
        position = at + len(run)
        text = detokenize(http, run)
        if item["type"] == "reasoning":
            assert text.replace("<think>", "").replace("</think>", "") == item["content"][0]["text"]
        elif item["type"] == "message":
            assert text == item["content"][0]["text"]
        else:
            assert item["type"] == "function_call"
            assert text.startswith("<tool_call>") and text.endswith("</tool_call>")
            call = json.loads(text[len("<tool_call>"):-len("</tool_call>")])
            assert (call["name"], call["arguments"]) == (item["name"], json.loads(item["arguments"]))
    gaps.append(ids[position:])
    assert [i for gap, run in zip(gaps, runs + [[]]) for i in gap + run] == ids
    assert all(not detokenize(http, gap).replace(END_OF_TURN, "").strip() for gap in gaps if gap)
    return runs


def done_items(events: list[dict]) -> list[dict]:
    return [event["item"] for event in events if event["type"] == "response.output_item.done"]


def test_item_ids_reasoning_then_text_streaming_and_not(http, tito_server):
    """A bias on </think> ends the tiny model's reasoning after three ids: a reasoning item (through
    </think>) and a message item whose ids make up the whole turn; streamed, each output_item.done
    carries the same ids as the item on the final response, which equals the non-streamed one."""
    body = {"input": A, "logit_bias": {str(THINK_END): 8}, "max_output_tokens": 12}
    plain = http.responses(**body).json()
    assert [item["type"] for item in plain["output"]] == ["reasoning", "message"]
    runs = check_item_ids(http, plain)
    assert runs[0][-1] == THINK_END and runs[0] + runs[1] == plain["token_ids"]
    events = http.stream(**body)
    final = events[-1]["response"]
    assert [(item["type"], item["token_ids"]) for item in final["output"]] == \
        [(item["type"], item["token_ids"]) for item in plain["output"]]
    assert [(item["type"], item["token_ids"]) for item in done_items(events)] == \
        [(item["type"], item["token_ids"]) for item in final["output"]]
    if "responses-stream" in tito_server.patches:
        from toolkit.verify.grammar import check_events

        assert check_events(events) == []
    off = http.responses(**body, return_token_ids=False).json()
    assert all("token_ids" not in item for item in off["output"])
    assert all("token_ids" not in item for item in done_items(http.stream(**body, return_token_ids=False)))


def test_item_ids_text_then_tool_call_streaming_and_not(http, tito_server):
    """Text, then a forced hermes call: the call's ids run from <tool_call> through </tool_call> (which
    the grammar makes the model spell with several ids), the end-of-turn id is no item's. vLLM itself
    reads the text before the call as reasoning when not streaming (its qwen3 parse ignores the prompt's
    </think>) and as a message when streaming: each item's ids are its own text's either way."""
    prompt = http.chat(A, max_tokens=1)["prompt_token_ids"] + [4094, THINK_END]
    body = {"input_ids": prompt, "tools": RESPONSES_TOOLS, "max_output_tokens": 120,
            "structured_outputs": {"regex": "Sure" + TOOL_CALL_REGEX}}
    plain = http.responses(**body).json()
    events = http.stream(**body)
    final = events[-1]["response"]
    for response in (plain, final):
        runs = check_item_ids(http, response)
        assert [item["type"] for item in response["output"]][-1] == "function_call"
        assert response["token_ids"][len(runs[0]) + len(runs[1]):] in ([], [3])  # the end-of-turn id
    assert [item["token_ids"] for item in final["output"]] == [item["token_ids"] for item in plain["output"]]
    assert [item["token_ids"] for item in done_items(events)] == [item["token_ids"] for item in final["output"]]
