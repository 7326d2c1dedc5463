"""tito (with token-ids) on a real SGLang 0.5.23 CPU server, over HTTP, with the tiny model.

One server for the module, on a private copy of the venv's ``sglang`` with both patches applied
(see ../token_ids/private_sglang.py), started with the hermes tool-call parser, ``TOOLKIT_OPENAI_METADATA=1``
and the test-only ``sgl_kernel`` shim. Greedy decoding on the tiny random model is deterministic, so the templated
path and the ``input_ids`` path must give the same ids exactly. Ends with a hypothesis fuzz of the
request body: no 500, and the server still answers afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness.fixtures import ensure_engine_python, ensure_tiny_model, sglang_env
from tests.patches.sglang.token_ids.private_sglang import private_install, sha256s

pytestmark = [pytest.mark.engine, pytest.mark.server]

VERSION = "0.5.23"
SERVER_ARGS = ["--tool-call-parser", "hermes"]
SERVER_ENV = {"TOOLKIT_OPENAI_METADATA": "1"}  # metadata as strings, for verifiers' client (weight_versions)
MESSAGES = [{"role": "user", "content": "Count from one to five."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
MARKERS = [4092, 4093, 4094, 4095]  # added tokens: each re-tokenizes to itself


@dataclass
class Served:
    url: str  # .../v1
    model: str
    tokenizer: object
    sha_before: dict[str, str]
    server: object  # toolkit.verify.server.EngineServer


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[Served]:
    import httpx  # noqa: F401  (the tests' client)
    from transformers import AutoTokenizer

    from toolkit import apply_patch, revert_patch
    from toolkit.verify.server import EngineServer

    python = private_install(ensure_engine_python(f"sglang-{VERSION}"), tmp_path_factory.mktemp("tito-server"))
    model = ensure_tiny_model()
    sha_before = sha256s(python)
    assert apply_patch(engine="sglang", patches=["token-ids", "tito"], python=python)
    try:
        env = {**sglang_env(), **SERVER_ENV}
        with EngineServer("sglang", python, model, SERVER_ARGS, env=env, timeout=600) as server:
            yield Served(server.openai_base_url, model, AutoTokenizer.from_pretrained(model), sha_before, server)
    finally:
        revert_patch(engine="sglang", patches=["token-ids", "tito"], python=python)
    assert sha256s(python) == sha_before


def post(served: Served, **body):
    import httpx

    body = {"model": served.model, "temperature": 0, "max_tokens": 12, **body}
    return httpx.post(f"{served.url}/chat/completions", json=body, timeout=120)


def chat(served: Served, **body) -> dict:
    response = post(served, **body)
    assert response.status_code == 200, response.text
    return response.json()


def stream(served: Served, **body) -> list[dict]:
    import httpx

    body = {"model": served.model, "temperature": 0, "max_tokens": 12, "stream": True, **body}
    chunks = []
    with httpx.stream("POST", f"{served.url}/chat/completions", json=body, timeout=120) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[len("data: "):]))
    return chunks


def streamed_ids(chunks: list[dict]) -> tuple[list[int] | None, dict[int, list[int]]]:
    per_choice: dict[int, list[int]] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            per_choice.setdefault(choice["index"], []).extend(choice.get("token_ids") or [])
    return chunks[0].get("prompt_token_ids"), per_choice


# --------------------------------------------------------------------------------------------------
# input_ids


def test_stock_backend_does_not_use_superlinear(served):
    """The superlinear plugin is installed in the venv (its ``sglang.srt.plugins`` entry point); without
    ``--attention-backend superlinear`` the server's attention stays SGLang's own.

    Moved from tests/patches/sglang/superlinear/test_server.py, whose 0.5.23 torch_native server (the dense
    reference there, now Hugging Face's) asserted the same on its log (issue 28: one server start less).
    """
    log = served.server.log_tail(10**7)  # the whole log: the backend is chosen at start-up
    assert "server_args=" in log, "the log does not reach back to the server's start"
    assert "superlinear attention on" not in log


def test_input_ids_are_echoed_and_continue_as_the_templated_prompt(served):
    templated = chat(served, messages=MESSAGES, return_token_ids=True)
    ids = templated["prompt_token_ids"]
    assert ids == list(served.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True))
    for messages in ([], MESSAGES, [{"role": "user", "content": "something else entirely"}]):
        sent = chat(served, messages=messages, input_ids=ids)  # messages never change the prompt
        assert sent["prompt_token_ids"] == ids
        assert sent["choices"][0]["token_ids"] == templated["choices"][0]["token_ids"]
        assert sent["choices"][0]["message"]["content"] == templated["choices"][0]["message"]["content"]


def test_streamed_input_ids_give_the_same_ids_and_n2_keeps_both_choices(served):
    ids = list(served.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True))
    plain = chat(served, messages=[], input_ids=ids)
    prompt, per_choice = streamed_ids(stream(served, messages=[], input_ids=ids))
    assert prompt == ids and per_choice == {0: plain["choices"][0]["token_ids"]}
    both = chat(served, messages=[], input_ids=ids, n=2)  # greedy: two equal choices
    assert [c["token_ids"] for c in both["choices"]] == [plain["choices"][0]["token_ids"]] * 2


def test_round_trip_next_turn_as_ids_equals_templated_next_turn(served):
    """Turn 1 by messages, its reply held to marker tokens (added tokens, each re-tokenizing to
    itself) by logit_bias; turn 2 as prompt_token_ids + token_ids + the next message's ids."""
    bias = {str(token): 100.0 for token in MARKERS}
    first = chat(served, messages=MESSAGES, max_tokens=6, logit_bias=bias, return_token_ids=True,
                 skip_special_tokens=False)
    reply_ids = first["choices"][0]["token_ids"]
    assert len(reply_ids) == 6 and set(reply_ids) <= set(MARKERS)
    user = {"role": "user", "content": "And the next three?"}
    reply = {"role": "assistant", "content": served.tokenizer.decode(reply_ids)}
    templated = chat(served, messages=[*MESSAGES, reply, user], return_token_ids=True)
    next_ids = served.tokenizer.encode(
        "<|im_end|>\n<|im_start|>user\nAnd the next three?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    ids = first["prompt_token_ids"] + reply_ids + next_ids
    assert ids == templated["prompt_token_ids"]
    again = chat(served, messages=[user], input_ids=ids)
    assert again["prompt_token_ids"] == ids
    assert again["choices"][0]["token_ids"] == templated["choices"][0]["token_ids"]


def test_stop_strings_and_stop_token_ids_are_honoured_with_input_ids(served):
    ids = list(served.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True))
    full = chat(served, messages=[], input_ids=ids, max_tokens=16, skip_special_tokens=False)
    text, out = full["choices"][0]["message"]["content"], full["choices"][0]["token_ids"]
    assert len(out) >= 6
    stop = served.tokenizer.decode(out[3:5])  # a string the greedy output contains
    stopped = chat(served, messages=[], input_ids=ids, max_tokens=16, stop=[stop], skip_special_tokens=False)
    choice = stopped["choices"][0]
    assert choice["finish_reason"] == "stop" and choice["matched_stop"] == stop
    assert stop not in choice["message"]["content"] and text.startswith(choice["message"]["content"])
    streamed = stream(served, messages=[], input_ids=ids, max_tokens=16, stop=[stop], skip_special_tokens=False)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in streamed if c["choices"]) == \
        choice["message"]["content"]
    by_id = chat(served, messages=[], input_ids=ids, max_tokens=16, stop_token_ids=[out[2]])
    assert by_id["choices"][0]["token_ids"] == out[:3] and by_id["choices"][0]["matched_stop"] == out[2]


def test_tools_with_input_ids_reach_the_parser(served):
    templated = chat(served, messages=MESSAGES, tools=TOOLS, return_token_ids=True)
    ids = templated["prompt_token_ids"]  # the template renders the tools as SGLang dumps them
    assert served.tokenizer.decode(ids).count("get_weather") == 1
    sent = chat(served, messages=[], tools=TOOLS, input_ids=ids)
    assert sent["choices"][0]["token_ids"] == templated["choices"][0]["token_ids"]
    assert sent["choices"][0]["message"] == templated["choices"][0]["message"]


# --------------------------------------------------------------------------------------------------
# logprobs and logprob_start_len


def test_logprob_entries_carry_token_ids_stream_and_not(served):
    ids = list(served.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True))
    plain = chat(served, messages=[], input_ids=ids, logprobs=True, top_logprobs=3)["choices"][0]
    entries = plain["logprobs"]["content"]
    assert [e["token_id"] for e in entries] == plain["token_ids"]
    for entry in entries:
        tops = entry["top_logprobs"]
        assert len(tops) == 3 and all(type(t["token_id"]) is int for t in tops)
        assert tops[0]["token_id"] == entry["token_id"]  # greedy: the sampled token is the top one
        assert len({t["token_id"] for t in tops}) == 3
        assert all(served.tokenizer.decode([t["token_id"]]) == t["token"] for t in tops)
    chunks = stream(served, messages=[], input_ids=ids, logprobs=True, top_logprobs=3)
    streamed = [e for c in chunks for ch in c["choices"] for e in ((ch.get("logprobs") or {}).get("content") or [])]
    assert [e["token_id"] for e in streamed] == [e["token_id"] for e in entries][: len(streamed)]
    assert len(streamed) >= len(entries) - 1


def test_logprob_start_len_returns_prompt_logprobs_from_that_position(served):
    ids = list(served.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True))
    response = chat(served, messages=[], input_ids=ids, logprob_start_len=3, max_tokens=2)
    prompt_logprobs = response["prompt_logprobs"]
    assert len(prompt_logprobs) == len(ids) and prompt_logprobs[:3] == [None] * 3
    for position in range(3, len(ids)):
        assert list(prompt_logprobs[position]) == [str(ids[position])]
        assert prompt_logprobs[position][str(ids[position])]["logprob"] <= 0
    assert response["choices"][0]["logprobs"] is None
    # the same logprobs from position 0 on (position 0 has none)
    whole = chat(served, messages=[], input_ids=ids, logprob_start_len=0, max_tokens=2)["prompt_logprobs"]
    assert whole[0] is None
    for position in range(3, len(ids)):
        assert whole[position][str(ids[position])]["logprob"] == pytest.approx(
            prompt_logprobs[position][str(ids[position])]["logprob"], abs=1e-4)
    assert "prompt_logprobs" not in chat(served, messages=[], input_ids=ids, max_tokens=2)


# --------------------------------------------------------------------------------------------------
# prefix splice and the tokens route


def test_splice_turn_two_starts_with_turn_one_ids_then_the_template_rest(served):
    """Turn one by messages; turn two sends the whole conversation plus turn one's ids. The tiny
    model's template (ChatML) puts its end of turn, the new user turn and the generation prompt
    after the reply."""
    first = chat(served, messages=MESSAGES, max_tokens=8, return_token_ids=True)
    prefix = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    user = {"role": "user", "content": "And the next three?"}
    reply = {"role": "assistant", "content": first["choices"][0]["message"]["content"]}
    rest = served.tokenizer.encode("<|im_end|>\n<|im_start|>user\nAnd the next three?<|im_end|>\n"
                                   "<|im_start|>assistant\n", add_special_tokens=False)
    second = chat(served, messages=[*MESSAGES, reply, user], prefix_token_ids=prefix)
    assert second["prompt_token_ids"] == prefix + rest
    prompt, per_choice = streamed_ids(stream(served, messages=[*MESSAGES, reply, user], prefix_token_ids=prefix))
    assert prompt == prefix + rest and per_choice[0] == second["choices"][0]["token_ids"]
    exact = chat(served, messages=[], input_ids=prefix + rest)  # the engine generated from that prompt
    assert exact["choices"][0]["token_ids"] == second["choices"][0]["token_ids"]


def test_splice_prefix_from_another_conversation_is_a_400_saying_where(served):
    first = chat(served, messages=MESSAGES, max_tokens=4, return_token_ids=True)
    prefix = first["prompt_token_ids"] + first["choices"][0]["token_ids"]
    other = [{"role": "user", "content": "Name three colours."},
             {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
             {"role": "user", "content": "More?"}]
    response = post(served, messages=other, prefix_token_ids=prefix)
    assert response.status_code == 400, response.text
    assert "messages[0] (user) 'Name three colours.' is not in the prefix's text" in response.json()["message"]


def test_tokens_route_takes_verifiers_body(served):
    """prime-rl / verifiers' token client: POST /v1/chat/completions/tokens with messages, tools,
    ``tokens`` (the whole prompt), logprobs and return_token_ids."""
    import httpx

    ids = list(served.tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True))
    body = {"model": served.model, "messages": [{"role": "user", "content": "not the prompt"}], "tools": TOOLS,
            "tokens": ids, "logprobs": True, "return_token_ids": True, "max_completion_tokens": 5, "temperature": 0}
    response = httpx.post(f"{served.url}/chat/completions/tokens", json=body, timeout=120)
    assert response.status_code == 200, response.text
    payload = response.json()
    assert payload["prompt_token_ids"] == ids
    choice = payload["choices"][0]
    assert [entry["token_id"] for entry in choice["logprobs"]["content"]] == choice["token_ids"]
    assert choice["token_ids"] == chat(served, messages=[], input_ids=ids, max_tokens=5)["choices"][0]["token_ids"]


def test_verifiers_token_client_runs_unchanged(served):
    """verifiers 0.3.1's own token client, two turns: turn 2 through SGLang's /tokenize (messages,
    add_generation_prompt) and the tokens route, its prompt turn 1's ids then the template's rest
    (tests/harness/verifiers_client.py). Needs TOOLKIT_OPENAI_METADATA: verifiers validates every
    response with openai's ChatCompletion, whose metadata is strings only."""
    from tests.harness.verifiers_client import assert_stitched, run_two_turns

    assert_stitched(run_two_turns(served.url.removesuffix("/v1"), served.model, eos_id=3), served.tokenizer)


# --------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize("body,message", [
    ({"input_ids": [1, "2"]}, "`input_ids` must contain only integers: item 1 is str '2'"),
    ({"input_ids": [5, -1]}, "`input_ids` must not contain negative ids: item 1 is -1"),
    ({"input_ids": [5, 4096]}, "`input_ids` item 1 is 4096, out of the vocabulary (ids must be < 4096)"),
    ({"input_ids": []}, "`input_ids` must not be empty"),
    ({"input_ids": [5] * 4090, "max_tokens": 6}, "`input_ids` has 4090 tokens and max_tokens is 6"),
    ({"input_ids": [5, 6, 7], "logprob_start_len": 3}, "`logprob_start_len` is 3, but the prompt has only 3 tokens"),
    ({"input_ids": [5, 6, 7], "logprob_start_len": 0, "stream": True}, "not available with `stream=true`"),
])
def test_bad_input_is_a_400_naming_the_field_and_the_server_keeps_serving(served, body, message):
    response = post(served, messages=[], **body)
    assert response.status_code == 400, response.text
    assert message in response.json()["message"]
    assert chat(served, messages=[], input_ids=[5, 6, 7], max_tokens=2)["prompt_token_ids"] == [5, 6, 7]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**31, 2**31) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=4),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=2),
    max_leaves=6,
)
fuzz_bodies = st.fixed_dictionaries({"max_tokens": st.integers(1, 2)}, optional={
    "input_ids": json_values | st.lists(st.integers(-2, 4100), max_size=5),
    "logprob_start_len": json_values | st.integers(-3, 6),
    "messages": st.just([]) | st.just(MESSAGES) | json_values,
    "stream": st.booleans(),
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(0, 3),
    "n": st.integers(1, 2),
    "return_token_ids": json_values,
    "stop": st.just(["a"]) | json_values,
})


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=fuzz_bodies)
def test_fuzzed_request_bodies_never_get_a_500(served, body):
    response = post(served, **body)
    assert response.status_code < 500, (body, response.text)
    if response.status_code == 200 and body.get("stream"):
        assert '"code":500' not in response.text and '"code": 500' not in response.text, (body, response.text)


def test_the_server_still_answers_after_the_fuzz(served):
    assert chat(served, messages=[], input_ids=[5, 6, 7], max_tokens=2)["prompt_token_ids"] == [5, 6, 7]
