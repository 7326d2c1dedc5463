"""Activation capture (and, below, steering) on the session's real patch-sweep servers (conftest.py),
against the Hugging Face forward-hook reference on the same weights (fp32 on CPU: 1e-4)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from toolkit.patches.common.spans import prompt_char_offsets, resolve_positions
from toolkit.clients.patch_study import PatchStudy, PatchStudyError, Span

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

TOL = 1e-4
PROMPT = "The cat sat on the mat."
ALL_HOOKS = ["pre_attn", "post_attn", "post_block", "attn_out", "mlp_out"]


def _reference_arrays(ref, ids, positions):
    _, acts = ref.run(ids, capture=True)
    return {key: value[positions].numpy() for key, value in acts.items()}


def assert_arrays_close(got: dict, want: dict, keys):
    for key in keys:
        assert got[key].shape == want[key].shape, key
        assert np.abs(got[key] - want[key]).max() <= TOL, key


def test_activations_json_base64_every_hook_equal_hf(sweep_server):
    ref = sweep_server.reference
    ids = ref.encode(PROMPT)
    body = {"prompt": PROMPT, "hooks": ALL_HOOKS, "layers": "all", "positions": [{"span": "mat"}, 0, 3]}
    response = sweep_server.post("/v1/activations", body)
    assert response.status_code == 200, response.text
    got = response.json()
    positions = resolve_positions(body["positions"], prompt_char_offsets(ref.tokenizer, PROMPT, ids))
    assert got["prompt_token_ids"] == ids and got["positions"] == positions and got["layers"] == [0, 1]
    arrays = {}
    for item in got["activations"]:
        assert item["dtype"] == "float32" and item["shape"] == [len(positions), 64]
        arrays[(item["hook"], item["layer"])] = np.frombuffer(base64.b64decode(item["data"]), "<f4").reshape(item["shape"])
    assert sorted(arrays) == sorted((h, layer) for h in ALL_HOOKS for layer in (0, 1))
    assert got["bytes"] == len(arrays) * len(positions) * 64 * 4
    assert_arrays_close(arrays, _reference_arrays(ref, ids, positions), arrays)


def test_activations_safetensors_read_by_the_safetensors_library(sweep_server):
    from safetensors.numpy import load

    ref = sweep_server.reference
    ids = ref.encode(PROMPT)
    body = {"prompt_token_ids": ids, "hooks": ["post_block", "mlp_out"], "layers": [1], "encoding": "safetensors"}
    response = sweep_server.post("/v1/activations", body)
    assert response.status_code == 200, response.text
    loaded = load(response.content)
    assert sorted(loaded) == ["mlp_out.1", "post_block.1"]
    want = _reference_arrays(ref, ids, list(range(len(ids))))
    assert_arrays_close({("post_block", 1): loaded["post_block.1"], ("mlp_out", 1): loaded["mlp_out.1"]}, want,
                        [("post_block", 1), ("mlp_out", 1)])


@pytest.mark.parametrize("encoding", ["safetensors", "base64"])
def test_patch_study_returns_numpy_arrays_for_text_chat_and_token_ids(sweep_server, encoding):
    ref = sweep_server.reference
    study = PatchStudy(sweep_server.base_url)
    text = study.activations(PROMPT, layers=[0], hooks=["post_attn"], positions=[Span("cat")], encoding=encoding)
    ids = ref.encode(PROMPT)
    positions = resolve_positions([{"span": "cat"}], prompt_char_offsets(ref.tokenizer, PROMPT, ids))
    assert text.positions == positions and text.prompt_token_ids == ids
    assert isinstance(text[("post_attn", 0)], np.ndarray) and text[("post_attn", 0)].dtype == np.float32
    assert_arrays_close(text.arrays, _reference_arrays(ref, ids, positions), [("post_attn", 0)])

    messages = [{"role": "user", "content": PROMPT}]
    chat = study.activations(messages=messages, layers=[1], positions=[Span("mat")], encoding=encoding)
    rendered = ref.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    chat_ids = ref.tokenizer.encode(rendered, add_special_tokens=False)
    chat_positions = resolve_positions([{"span": "mat"}], prompt_char_offsets(ref.tokenizer, rendered, chat_ids))
    assert chat.prompt_token_ids == chat_ids and chat.positions == chat_positions
    assert_arrays_close(chat.arrays, _reference_arrays(ref, chat_ids, chat_positions), [("post_block", 1)])

    by_ids = study.activations(prompt_token_ids=ids, layers=[1], positions=[len(ids) - 1], encoding=encoding)
    assert_arrays_close(by_ids.arrays, _reference_arrays(ref, ids, [len(ids) - 1]), [("post_block", 1)])


BAD_ACTIVATIONS = [
    ("no-prompt", {"prompt": None}, "exactly one of prompt"),
    ("two-prompts", {"prompt_token_ids": [1, 2]}, "exactly one of prompt"),
    ("unknown-field", {"layer": [0]}, "unknown field(s) layer"),
    ("unknown-hook", {"hooks": ["resid_mid"]}, "hooks must be a non-empty list"),
    ("empty-hooks", {"hooks": []}, "hooks must be a non-empty list"),
    ("layer-out-of-range", {"layers": [5]}, "layer 5 out of range"),
    ("bad-encoding", {"encoding": "npy"}, "encoding must be one of"),
    ("span-not-found", {"positions": [{"span": "zebra"}]}, "not found"),
    ("position-out-of-range", {"positions": [50]}, "position 50 out of range"),
    ("token-ids-with-span", {"prompt": None, "prompt_token_ids": [0, 5, 6], "positions": [{"span": "a"}]},
     "spans need a text prompt"),
    ("token-id-out-of-vocab", {"prompt": None, "prompt_token_ids": [0, 99999]}, "prompt_token_ids must be"),
    ("bad-messages", {"prompt": None, "messages": [{"role": "user"}]}, "messages must be"),
    ("over-the-size-bound", {"prompt": " ".join(["word"] * 100), "hooks": ALL_HOOKS}, "over this server's bound"),
]


@pytest.mark.parametrize("change,message", [b[1:] for b in BAD_ACTIVATIONS], ids=[b[0] for b in BAD_ACTIVATIONS])
def test_bad_activation_requests_are_clean_400s(sweep_server, change, message):
    base = {"prompt": PROMPT, "layers": [0, 1], "hooks": ["post_block"]}
    body = {k: v for k, v in {**base, **change}.items() if v is not None}
    response = sweep_server.post("/v1/activations", body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]
    assert sweep_server.post("/v1/activations", base).status_code == 200


def test_patch_study_raises_the_servers_400(sweep_server):
    with pytest.raises(PatchStudyError, match="over this server's bound") as caught:
        PatchStudy(sweep_server.base_url).activations(" ".join(["word"] * 100), hooks=ALL_HOOKS)
    assert caught.value.status == 400


# --------------------------------------------------------------------------------------------------
# steering on chat and completions requests


def vector(seed: int, size: float = 3.0) -> list[float]:
    import torch

    return (torch.randn(64, generator=torch.Generator().manual_seed(seed)) * size).tolist()


def reference_steer(ref, entries: list[dict], prompt: str | None, prompt_ids: list[int]):
    """The request's steering entries as the reference's Steer edits, positions resolved here."""
    import torch

    from scripts.support.hf_reference import Steer

    edits = []
    for entry in entries:
        where = entry.get("positions", "all")
        if where == "all":
            selects = lambda p, n: True  # noqa: E731
        elif where == "prompt":
            selects = lambda p, n: p < n  # noqa: E731
        elif where == "generated":
            selects = lambda p, n: p >= n  # noqa: E731
        else:
            ints, ranges = set(), []
            for item in where:
                if isinstance(item, int):
                    ints.add(item)
                elif "span" in item:
                    ints |= set(resolve_positions([item], prompt_char_offsets(ref.tokenizer, prompt, prompt_ids)))
                else:
                    ranges.append((item.get("start", 0), item.get("stop") or 10**9))
            selects = lambda p, n, ints=ints, ranges=ranges: p in ints or any(a <= p < b for a, b in ranges)  # noqa: E731
        edits.append(Steer(entry["layer"], entry.get("hook", "post_block"), torch.tensor(entry["vector"]), selects,
                           len(prompt_ids), entry.get("scale", 1.0)))
    return edits


def completion_tokens(choice: dict) -> tuple[list[int], list[float]]:
    """Token ids (``return_tokens_as_token_ids``) and their logprobs from a completions choice."""
    logprobs = choice["logprobs"]
    return [int(t.split(":", 1)[1]) for t in logprobs["tokens"]], [float(x) for x in logprobs["token_logprobs"]]


def streamed_completion(sweep_server, body: dict) -> tuple[list[int], list[float]]:
    import json

    ids, logprobs = [], []
    with sweep_server.http.stream("POST", "/v1/completions", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    if choice.get("logprobs"):
                        got = completion_tokens(choice)
                        ids += got[0]
                        logprobs += got[1]
    return ids, logprobs


LONG_PROMPT = " ".join(f"w{i}" for i in range(120))  # more than one KV block, so the prefix cache can serve it
STEERING = [
    {"layer": 0, "hook": "post_block", "vector": vector(1), "positions": [{"span": "cat"}, {"start": 8}]},
    {"layer": 1, "hook": "pre_attn", "vector": vector(2), "positions": "generated", "scale": 0.5},
]


def test_steered_completion_equals_hf_stream_equals_nonstream(sweep_server):
    from scripts.support.hf_reference import steered_greedy, steered_logprobs

    ref = sweep_server.reference
    ids = ref.encode(PROMPT)
    body = {"model": sweep_server.model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 1,
            "return_tokens_as_token_ids": True, "ignore_eos": True, "steering": STEERING}
    response = sweep_server.post("/v1/completions", body)
    assert response.status_code == 200, response.text
    got_ids, got_logprobs = completion_tokens(response.json()["choices"][0])
    steer = reference_steer(ref, STEERING, PROMPT, ids)
    assert got_ids == steered_greedy(ref, ids, 6, steer)
    want = steered_logprobs(ref, ids, got_ids, steer)
    assert max(abs(a - b) for a, b in zip(got_logprobs, want)) <= TOL
    plain = steered_logprobs(ref, ids, got_ids, [])
    assert max(abs(a - b) for a, b in zip(plain, want)) > 1e-2  # the steering matters
    assert streamed_completion(sweep_server, body) == (got_ids, got_logprobs)


def test_steered_chat_equals_hf_stream_equals_nonstream(sweep_server):
    import json

    from scripts.support.hf_reference import steered_logprobs

    ref = sweep_server.reference
    messages = [{"role": "user", "content": PROMPT}]
    ids = ref.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
    steering = [{"layer": 1, "hook": "post_attn", "vector": vector(3), "positions": "all"},
                {"layer": 0, "hook": "pre_attn", "vector": vector(4, 1.0), "positions": [2, 3, {"start": 5, "stop": 9}]}]
    body = {"model": sweep_server.model, "messages": messages, "max_tokens": 5, "temperature": 0, "logprobs": True,
            "return_tokens_as_token_ids": True, "ignore_eos": True, "steering": steering}
    response = sweep_server.post("/v1/chat/completions", body)
    assert response.status_code == 200, response.text
    content = response.json()["choices"][0]["logprobs"]["content"]
    got_ids = [int(c["token"].split(":", 1)[1]) for c in content]
    got_logprobs = [c["logprob"] for c in content]
    want = steered_logprobs(ref, ids, got_ids, reference_steer(ref, steering, None, ids))
    assert len(got_ids) == 5 and max(abs(a - b) for a, b in zip(got_logprobs, want)) <= TOL
    streamed = []
    with sweep_server.http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as stream:
        for line in stream.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    streamed += [(c["token"], c["logprob"]) for c in (choice.get("logprobs") or {}).get("content") or []]
    assert streamed == [(c["token"], c["logprob"]) for c in content]


def test_steering_with_n_samples_every_choice_equals_hf(sweep_server):
    from scripts.support.hf_reference import steered_logprobs

    ref = sweep_server.reference
    ids = ref.encode(PROMPT)
    body = {"model": sweep_server.model, "prompt": PROMPT, "max_tokens": 5, "temperature": 1.0, "seed": 7, "n": 3,
            "logprobs": 1, "return_tokens_as_token_ids": True, "ignore_eos": True, "steering": STEERING}
    response = sweep_server.post("/v1/completions", body)
    assert response.status_code == 200, response.text
    choices = response.json()["choices"]
    assert len(choices) == 3
    steer = reference_steer(ref, STEERING, PROMPT, ids)
    for choice in choices:
        got_ids, got_logprobs = completion_tokens(choice)
        want = steered_logprobs(ref, ids, got_ids, steer)
        assert max(abs(a - b) for a, b in zip(got_logprobs, want)) <= TOL


def _cached_tokens(response) -> int:
    details = response.json()["usage"].get("prompt_tokens_details") or {}
    return int(details.get("cached_tokens") or 0)


def test_prefix_cache_never_mixes_steered_and_unsteered_kv(sweep_server):
    from scripts.support.hf_reference import steered_logprobs

    ref = sweep_server.reference
    ids = ref.encode(LONG_PROMPT)
    assert 128 < len(ids) < 400
    plain_body = {"model": sweep_server.model, "prompt": LONG_PROMPT, "max_tokens": 3, "temperature": 0,
                  "logprobs": 1, "return_tokens_as_token_ids": True, "ignore_eos": True}
    steering = [{"layer": 0, "vector": vector(5), "positions": "prompt"}]
    steered_body = {**plain_body, "steering": steering}
    steer = reference_steer(ref, steering, LONG_PROMPT, ids)

    def check(response, edits):
        assert response.status_code == 200, response.text
        got_ids, got_logprobs = completion_tokens(response.json()["choices"][0])
        want = steered_logprobs(ref, ids, got_ids, edits)
        assert max(abs(a - b) for a, b in zip(got_logprobs, want)) <= TOL
        return got_ids, got_logprobs

    first = check(sweep_server.post("/v1/completions", plain_body), [])  # fills the cache, unsteered
    again = sweep_server.post("/v1/completions", plain_body)
    assert _cached_tokens(again) > 0  # the prefix cache is at work for unsteered requests
    assert check(again, []) == first
    for _ in range(2):  # steered twice: neither reads unsteered KV, nor the first steered request's
        steered = sweep_server.post("/v1/completions", steered_body)
        check(steered, steer)
        assert _cached_tokens(steered) == 0
    after = sweep_server.post("/v1/completions", plain_body)  # the steered KV is never served to it
    assert check(after, []) == first
    # a client-chosen cache_salt shared with an unsteered request does not let steered KV through either
    salted = {**plain_body, "cache_salt": "shared-salt"}
    sweep_server.post("/v1/completions", {**salted, "steering": steering})
    assert check(sweep_server.post("/v1/completions", salted), []) == first


def test_a_plan_smuggled_through_vllm_xargs_is_ignored(sweep_server):
    import json

    from scripts.support.hf_reference import steered_logprobs

    ref = sweep_server.reference
    ids = ref.encode(PROMPT)
    fake = json.dumps({"secret": "guess", "edits": [{"layer": 0, "hook": "post_block", "vector": vector(1), "scale": 1.0,
                                                    "positions": {"words": ["all"], "ints": [], "ranges": []}}]})
    body = {"model": sweep_server.model, "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "logprobs": 1,
            "return_tokens_as_token_ids": True, "ignore_eos": True, "vllm_xargs": {"toolkit_steer": fake}}
    response = sweep_server.post("/v1/completions", body)
    assert response.status_code == 200, response.text
    got_ids, got_logprobs = completion_tokens(response.json()["choices"][0])
    want = steered_logprobs(ref, ids, got_ids, [])
    assert max(abs(a - b) for a, b in zip(got_logprobs, want)) <= TOL


BAD_STEERING = [
    ("not-a-list", {"layer": 0}, "steering must be a non-empty list"),
    ("empty", [], "steering must be a non-empty list"),
    ("entry-not-object", [3], "steering[0] must be an object"),
    ("unknown-field", [{"layer": 0, "vector": vector(1), "layers": [0]}], "steering[0]: unknown field(s) layers"),
    ("layer-missing", [{"vector": vector(1)}], "steering[0].layer must be an integer"),
    ("layer-out-of-range", [{"layer": 2, "vector": vector(1)}], "steering[0]: layer 2 out of range"),
    ("bad-hook", [{"layer": 0, "hook": "mlp_out", "vector": vector(1)}], "steering[0].hook must be one of"),
    ("short-vector", [{"layer": 0, "vector": [1.0] * 63}], "steering[0].vector must be a list of 64"),
    ("vector-with-string", [{"layer": 0, "vector": ["x"] * 64}], "steering[0].vector must be a list of 64"),
    ("bad-scale", [{"layer": 0, "vector": vector(1), "scale": "big"}], "steering[0].scale must be"),
    ("bad-positions-word", [{"layer": 0, "vector": vector(1), "positions": "some"}], "steering[0].positions must be"),
    ("negative-position", [{"layer": 0, "vector": vector(1), "positions": [-1]}], "position -1 is negative"),
    ("bad-range", [{"layer": 0, "vector": vector(1), "positions": [{"start": 5, "stop": 2}]}], "a range is"),
    ("span-not-found", [{"layer": 0, "vector": vector(1), "positions": [{"span": "zebra"}]}], "span 'zebra' not found"),
]


@pytest.mark.parametrize("steering,message", [b[1:] for b in BAD_STEERING], ids=[b[0] for b in BAD_STEERING])
def test_bad_steering_is_a_clean_400_on_both_routes(sweep_server, steering, message):
    completion = {"model": sweep_server.model, "prompt": PROMPT, "max_tokens": 1, "steering": steering}
    response = sweep_server.post("/v1/completions", completion)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]
    chat = {"model": sweep_server.model, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1,
            "steering": steering}
    response = sweep_server.post("/v1/chat/completions", chat)
    assert response.status_code == 400, response.text
    if "span" not in message:  # chat refuses spans outright
        assert message in response.json()["error"]["message"]
    else:
        assert "spans need a completions request" in response.json()["error"]["message"]
    assert sweep_server.post("/v1/completions", {**completion, "steering": STEERING}).status_code == 200
