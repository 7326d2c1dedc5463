"""Bad input to the tito fields on the real patched server: a 400 naming the field and the reason,
the server staying up, and a fuzzed request body never giving a 500 nor disturbing other requests."""

from __future__ import annotations

import concurrent.futures
import json

import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

CONTEXT = 512  # --max-model-len of the test server (toolkit.verify.server_launch's CPU default)
VOCAB = 4096
A = [{"role": "user", "content": "Name three prime numbers."}]
CANARY = {"messages": [{"role": "user", "content": "def fibonacci(n):"}], "max_tokens": 8, "temperature": 0,
          "return_token_ids": True}


@pytest.fixture(scope="module")
def client(tito_server):
    with httpx.Client(base_url=tito_server.base_url, timeout=120) as http:
        yield http


@pytest.fixture(scope="module")
def model(tito_server) -> str:
    return tito_server.model


def post(client, model, body: dict) -> httpx.Response:
    return client.post("/v1/chat/completions", json={"model": model, **body})


def healthy(client) -> bool:
    return client.get("/health").status_code == 200


BAD = [
    ({"input_ids": "1 2 3"}, "input_ids", "must be a list"),
    ({"input_ids": [1, "2", 3]}, "input_ids", "must contain only integers: item 1 is str"),
    ({"input_ids": [1, 2.5]}, "input_ids", "must contain only integers: item 1 is float"),
    ({"input_ids": [7.0]}, "input_ids", "must contain only integers: item 0 is float"),
    ({"input_ids": [True, 5]}, "input_ids", "must contain only integers: item 0 is bool"),
    ({"input_ids": [[1, 2]]}, "input_ids", "must contain only integers: item 0 is list"),
    ({"input_ids": [5, None]}, "input_ids", "must contain only integers: item 1 is NoneType"),
    ({"input_ids": [5, -1]}, "input_ids", "must not contain negative ids: item 1 is -1"),
    ({"input_ids": [5, VOCAB]}, "input_ids", f"item 1 is {VOCAB}, out of the vocabulary (ids must be < {VOCAB})"),
    ({"input_ids": [10**30]}, "input_ids", "out of the vocabulary"),
    ({"input_ids": []}, "input_ids", "must not be empty"),
    ({"input_ids": [5] * 500, "max_tokens": 13}, "input_ids", "500 tokens and max_tokens is 13"),
    ({"input_ids": [5] * 500, "max_completion_tokens": 13}, "input_ids", "exceeds the model's context of 512"),
    ({"input_ids": [5] * CONTEXT, "max_tokens": None}, "input_ids", "leaves no room for output"),
    ({"input_ids": [5] * 2000, "max_tokens": 4}, "input_ids", "2000 tokens"),
    ({"input_ids": [5, 6], "truncate_prompt_tokens": 1}, "truncate_prompt_tokens", "cannot be used with `input_ids`"),
    ({"input_ids": [5, 6, 7], "logprob_start_len": 3}, "logprob_start_len", "the prompt has only 3 tokens"),
    ({"input_ids": [5, 6, 7], "logprob_start_len": -2}, "logprob_start_len", "must be -1"),
    ({"input_ids": [5, 6, 7], "logprob_start_len": "1"}, "logprob_start_len", "must be an integer"),
    ({"messages": A, "logprob_start_len": 10_000}, "logprob_start_len", "the prompt has only"),
    ({"messages": A, "logprob_start_len": 0, "stream": True}, "logprob_start_len", "not available with `stream=true`"),
]


@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
@pytest.mark.parametrize("body,field,reason", BAD, ids=[f"{i}-{case[1]}" for i, case in enumerate(BAD)])
def test_bad_input_is_a_400_naming_field_and_reason(client, model, body, field, reason, stream):
    body = {"max_tokens": 4, **body}
    if stream:
        body.setdefault("stream", True)
        start = body.get("logprob_start_len")
        if type(start) is int and start >= 0:
            reason = "not available with `stream=true`"  # checked before the prompt is rendered
    response = post(client, model, body)
    assert response.status_code == 400, response.text[:500]
    error = response.json()["error"]
    assert error["param"] == field
    assert f"`{field}`" in error["message"] and reason in error["message"], error["message"]
    assert healthy(client)


def test_server_still_answers_after_bad_input(client, model):
    for body, _, _ in BAD:
        post(client, model, {"max_tokens": 4, **body})
    response = post(client, model, {"input_ids": [5, 6, 7], "max_tokens": 3})
    assert response.status_code == 200 and response.json()["prompt_token_ids"] == [5, 6, 7]


# --------------------------------------------------------------------------------------------------
# fuzz

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10**20), st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4)
)
# Values that are wrong (or at the edge) for each field: a fuzzed body is a valid one with 0 to 2 of
# its fields replaced by one of these, so that both the 200 and the 400 paths get exercised.
BAD_VALUES = {
    "input_ids": st.one_of(
        st.lists(st.integers(-3, VOCAB + 3), max_size=24),
        st.lists(st.integers(0, VOCAB - 1), min_size=CONTEXT - 20, max_size=CONTEXT + 5),
        st.lists(st.one_of(st.integers(0, 50), json_scalars, st.lists(st.integers(0, 9), max_size=2)), max_size=6),
        json_scalars,
    ),
    "messages": st.one_of(st.just("hi"), st.just([{"role": 3}]), st.just([{}]), json_scalars),
    # (never null: the default budget is the whole context, slow on a CPU)
    "max_tokens": st.one_of(st.integers(-2, 0), st.integers(CONTEXT, CONTEXT + 9), st.just("8"), st.just(2.5),
                            st.text(max_size=3), st.booleans()),
    "n": st.one_of(st.integers(-1, 0), json_scalars),
    "stop": st.one_of(st.lists(json_scalars, max_size=2), json_scalars),
    "stop_token_ids": st.one_of(st.lists(st.integers(-3, VOCAB + 3), max_size=2), json_scalars),
    "logprobs": json_scalars,
    "top_logprobs": st.one_of(st.integers(-3, 25), json_scalars),
    "logprob_start_len": st.one_of(st.integers(-5, 40), json_scalars),
    "stream": json_scalars,
    "return_token_ids": json_scalars,
    "temperature": st.one_of(st.floats(-2, 0), json_scalars),
    "truncate_prompt_tokens": st.integers(-2, 30),
}


@st.composite
def bodies(draw) -> dict:
    ids = draw(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=24))
    stream = draw(st.booleans())
    body: dict = {"input_ids": ids, "max_tokens": draw(st.integers(1, 12)), "stream": stream}
    if draw(st.booleans()):
        body["messages"] = draw(st.sampled_from([[], A]))
    if draw(st.booleans()):
        body["n"] = draw(st.integers(1, 2))
        body["temperature"] = draw(st.floats(0, 1.5))
        body["seed"] = draw(st.integers(0, 2**31 - 1))
    if draw(st.booleans()):
        body["stop"] = draw(st.lists(st.text(min_size=1, max_size=3), max_size=2))
    if draw(st.booleans()):
        body["stop_token_ids"] = draw(st.lists(st.integers(0, VOCAB - 1), max_size=2))
    if draw(st.booleans()):
        body["logprobs"] = True
        body["top_logprobs"] = draw(st.integers(0, 3))
    if not stream and draw(st.booleans()):
        body["logprob_start_len"] = draw(st.integers(-1, len(ids) - 1))
    if draw(st.booleans()):
        body["return_token_ids"] = draw(st.booleans())
    for field in draw(st.lists(st.sampled_from(sorted(BAD_VALUES)), max_size=2, unique=True)):
        body[field] = draw(BAD_VALUES[field])
    return body


def call(client, model, body: dict) -> tuple[int, object]:
    """(status, payload): the JSON body, or the list of chunks when the server streams."""
    with client.stream("POST", "/v1/chat/completions", json={"model": model, **body}) as response:
        response.read()
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        return response.status_code, response.json()
    lines = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert lines and lines[-1] == "[DONE]", lines[-3:]
    return response.status_code, [json.loads(line) for line in lines[:-1]]


@pytest.fixture(scope="module")
def canary(client, model) -> dict:
    status, payload = call(client, model, CANARY)
    assert status == 200
    return payload


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(body=bodies())
def test_fuzzed_body_never_500_and_neighbours_unharmed(client, model, canary, body):
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        neighbour = pool.submit(call, client, model, CANARY)
        status, payload = call(client, model, body)
        neighbour_status, neighbour_payload = neighbour.result()
    assert status in (200, 400), (status, payload)
    event(f"status {status}")
    if status == 400:
        assert payload["error"]["message"]
    else:
        chunks = payload if isinstance(payload, list) else [payload]
        assert not any("error" in chunk for chunk in chunks), chunks
        prompt_ids = [c["prompt_token_ids"] for c in chunks if c.get("prompt_token_ids") is not None]
        if body.get("input_ids") is not None:
            event("200 with input_ids")
            assert all(ids == body["input_ids"] for ids in prompt_ids), prompt_ids
            if body.get("return_token_ids") in (None, True):
                assert prompt_ids, "no prompt_token_ids"
    assert neighbour_status == 200
    assert neighbour_payload["choices"][0]["token_ids"] == canary["choices"][0]["token_ids"]
    assert neighbour_payload["prompt_token_ids"] == canary["prompt_token_ids"]


def test_server_healthy_after_fuzz(client, model, canary):
    assert healthy(client)
    status, payload = call(client, model, CANARY)
    assert status == 200 and payload["choices"][0]["token_ids"] == canary["choices"][0]["token_ids"]
