"""Activation capture (and, below, steering) on the session's real patch-sweep servers (conftest.py),
against the Hugging Face forward-hook reference on the same weights (fp32 on CPU: 1e-4)."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from toolkit.patches.common.spans import prompt_char_offsets, resolve_positions
from toolkit.patches.vllm.patch_sweep.client import PatchStudy, PatchStudyError, Span

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
