"""The backend's engine-agnostic parts without an engine: configuration, paged reads, ragged batches.

The ragged batch (prefill, chunked prefill and decode rows of several requests, K/V read back from a
shuffled paged cache through the kernels' one ``PagedKV`` interface, as both engines' backends do)
must equal the kernels' naive reference run request by request.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from toolkit.kernels.superlinear.dispatch import superlinear_attention
from toolkit.patches.common.superlinear.config import SuperlinearConfig, covering_length, load_config
from toolkit.patches.common.superlinear.switch import SuperlinearConfigError, backend_enabled
from toolkit.kernels.superlinear.paged import PagedKV, decode_positions, layout_from_probe
from toolkit.patches.common.superlinear.ragged import superlinear_ragged
from toolkit.patches.vllm.superlinear.cpu_cache import split_kv_cache

HQ, HKV, D, BS = 4, 2, 32, 16
COVERING = SuperlinearConfig(sw_index=7, backward_factor=8.0, forward_factor=8.0)


# --- configuration ---------------------------------------------------------------------------------

def test_backend_switch_values():
    assert backend_enabled({}) is False
    assert backend_enabled({"TOOLKIT_ATTENTION_BACKEND": "dense"}) is False
    assert backend_enabled({"TOOLKIT_ATTENTION_BACKEND": "Superlinear"}) is True
    with pytest.raises(SuperlinearConfigError, match="TOOLKIT_ATTENTION_BACKEND='flash'"):
        backend_enabled({"TOOLKIT_ATTENTION_BACKEND": "flash"})


def test_config_precedence_env_json_then_variables_then_engine():
    env = {"TOOLKIT_SUPERLINEAR_CONFIG": json.dumps({"topk": 2, "sw_index": 1}),
           "TOOLKIT_SUPERLINEAR_SW_INDEX": "3", "TOOLKIT_SUPERLINEAR_BACKWARD_FACTOR": "3.5"}
    cfg = load_config(env, {"forward_factor": 1})
    assert (cfg.topk, cfg.sw_index, cfg.backward_factor, cfg.forward_factor) == (2, 3, 3.5, 1.0)
    assert cfg.window == 15
    assert load_config({}) == SuperlinearConfig()


@pytest.mark.parametrize("env, engine, message", [
    ({"TOOLKIT_SUPERLINEAR_TOPK": "three"}, None, "TOOLKIT_SUPERLINEAR_TOPK: topk must be an integer"),
    ({"TOOLKIT_SUPERLINEAR_TOPK": "0"}, None, "topk must be an int in 1..16"),
    ({"TOOLKIT_SUPERLINEAR_WINDOW": "16"}, None, "unknown environment variable.*TOOLKIT_SUPERLINEAR_WINDOW"),
    ({"TOOLKIT_SUPERLINEAR_CONFIG": "{"}, None, "not valid JSON"),
    ({}, {"windw": 3}, "unknown setting.*'windw'"),
    ({}, {"span_power": 1.5}, "span_power must be in"),
    ({}, {"search_power": 0.5, "inv_search_power_int": 2}, "either search_power or inv_search_power_int"),
    ({}, {"impl": "cuda"}, "impl must be one of"),
    ({}, [1, 2], "must be a JSON object"),
])
def test_bad_settings_raise_one_clear_error(env, engine, message):
    with pytest.raises(SuperlinearConfigError, match=message):
        load_config(env, engine)


def test_covering_length_matches_the_geometry():
    # Window only (no stripe can exist) up to W + 1 tokens; spans of 8*sqrt(t) each way reach both ends
    # of the prefix up to 168 tokens with W = 63.
    assert covering_length(SuperlinearConfig(sw_index=7, backward_factor=8.0, forward_factor=8.0)) == 168
    assert covering_length(SuperlinearConfig()) == 3


# --- paged reads -----------------------------------------------------------------------------------

def _transposed_write(k, v, key_cache, value_cache, slots):
    """A cache write like vLLM's 'vec' CPU kernels: keys of a block stored [D, block_size]."""
    bs = key_cache.shape[2]
    for i, s in enumerate(slots.tolist()):
        blk, off = divmod(s, bs)
        kb = key_cache[blk].reshape(key_cache.shape[1], -1).view(key_cache.shape[1], key_cache.shape[3], bs)
        kb[:, :, off] = k[i]
        value_cache[blk, :, off] = v[i]


def test_probe_finds_a_transposed_key_layout_and_reads_tokens_back():
    k_perm, v_perm = layout_from_probe(_transposed_write, BS, D, torch.float32)
    assert k_perm is not None and v_perm is None
    gen = torch.Generator().manual_seed(0)
    n, blocks = 37, torch.tensor([5, 1, 3, 0])
    kv = torch.zeros(6, HKV, BS, 2 * D)
    key_cache, value_cache = split_kv_cache(kv)
    keys, values = torch.randn(n, HKV, D, generator=gen), torch.randn(n, HKV, D, generator=gen)
    slots = torch.tensor([int(blocks[i // BS]) * BS + i % BS for i in range(n)])
    _transposed_write(keys, values, key_cache, value_cache, slots)
    paged = PagedKV.from_blocks(key_cache, value_cache, blocks[None], torch.tensor([n]), k_perm, v_perm)
    rk, rv = paged.read_prefix(0, n)
    assert torch.equal(rk, keys.transpose(0, 1)) and torch.equal(rv, values.transpose(0, 1))
    some = torch.tensor([36, 0, 17, 16, 5])
    pk, pv = paged.read_positions(0, some)
    assert torch.equal(pk, keys[some].transpose(0, 1)) and torch.equal(pv, values[some].transpose(0, 1))


# --- ragged batches --------------------------------------------------------------------------------

def _paged_batch(seq_lens, query_lens, seed=0):
    """A shuffled paged cache holding the requests' K/V, the flattened queries, and per-request dense K/V."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // BS) for n in seq_lens]
    order = torch.randperm(sum(need) + 3, generator=gen)
    tables, at = [], 0
    for nb in need:
        tables.append(order[at:at + nb])
        at += nb
    width = max(need)
    block_table = torch.stack([torch.cat([t, torch.zeros(width - len(t), dtype=t.dtype)]) for t in tables])
    kv = torch.zeros(sum(need) + 3, HKV, BS, 2 * D)
    key_cache, value_cache = split_kv_cache(kv)
    dense = []
    for r, n in enumerate(seq_lens):
        k, v = torch.randn(HKV, n, D, generator=gen), torch.randn(HKV, n, D, generator=gen)
        for t in range(n):
            blk = int(tables[r][t // BS])
            key_cache[blk, :, t % BS] = k[:, t]
            value_cache[blk, :, t % BS] = v[:, t]
        dense.append((k, v))
    query = torch.randn(sum(query_lens), HQ, D, generator=gen)
    starts = [0]
    for q in query_lens:
        starts.append(starts[-1] + q)
    return query, starts, block_table, key_cache, value_cache, dense


class CountingKV(PagedKV):
    """The batch's ``PagedKV``; ``reads[r]`` counts the positions read for request r's decode."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        object.__setattr__(self, "reads", {})

    def read_positions(self, r, positions):
        self.reads[r] = self.reads.get(r, 0) + positions.numel()
        return super().read_positions(r, positions)


def _kv(block_table, key_cache, value_cache, seq_lens) -> CountingKV:
    return CountingKV(key_cache, value_cache, block_table, torch.tensor(seq_lens), None, None, None)


@pytest.mark.parametrize("config", [SuperlinearConfig(), SuperlinearConfig(sw_index=2, topk=2, forward_factor=1.0),
                                    COVERING])
def test_ragged_mixed_batch_equals_naive_reference_per_request(config):
    # request 0: whole prompt; 1: a later chunk of a chunked prefill; 2 and 3: decodes at different lengths.
    seq_lens, query_lens = [150, 300, 97, 260], [150, 64, 1, 1]
    query, starts, block_table, key_cache, value_cache, dense = _paged_batch(seq_lens, query_lens)

    scale = D ** -0.5
    out = torch.full_like(query, float("nan"))
    superlinear_ragged(query, _kv(block_table, key_cache, value_cache, seq_lens), starts, config, scale, out)
    for r, (n, qn) in enumerate(zip(seq_lens, query_lens)):
        k, v = dense[r]
        q = query[starts[r]:starts[r + 1]].transpose(0, 1)[None]
        ref = superlinear_attention(q, q, k[None], v[None], torch.arange(n - qn, n), scale=scale, impl="naive",
                                    **config.kernel_kwargs())
        torch.testing.assert_close(out[starts[r]:starts[r + 1]], ref[0].transpose(0, 1).float(), atol=2e-5, rtol=2e-5)


def test_covering_regime_equals_dense_causal_attention():
    n = covering_length(COVERING)
    seq_lens, query_lens = [n, n - 40], [n, 1]
    query, starts, block_table, key_cache, value_cache, dense = _paged_batch(seq_lens, query_lens, seed=1)

    out = torch.empty_like(query)
    superlinear_ragged(query, _kv(block_table, key_cache, value_cache, seq_lens), starts, COVERING, D ** -0.5, out)
    for r, (m, qn) in enumerate(zip(seq_lens, query_lens)):
        k, v = (x.repeat_interleave(HQ // HKV, 0) for x in dense[r])
        q = query[starts[r]:starts[r + 1]].transpose(0, 1)
        mask = torch.arange(m)[None, :] <= torch.arange(m - qn, m)[:, None]
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        torch.testing.assert_close(out[starts[r]:starts[r + 1]], ref.transpose(0, 1), atol=1e-5, rtol=1e-5)


def test_decode_reads_only_stripes_window_and_spans():
    # One long decode: it must read O(sqrt t) keys of its 4,000, and still equal the naive reference.
    config = SuperlinearConfig(sw_index=3)
    seq_lens, query_lens = [4000, 60], [1, 60]
    query, starts, block_table, key_cache, value_cache, dense = _paged_batch(seq_lens, query_lens, seed=2)
    kv = _kv(block_table, key_cache, value_cache, seq_lens)
    out = torch.empty_like(query)
    superlinear_ragged(query, kv, starts, config, D ** -0.5, out)
    reads = kv.reads
    k, v = dense[0]
    q = query[0:1].transpose(0, 1)[None]
    ref = superlinear_attention(q, q, k[None], v[None], torch.tensor([3999]), scale=D ** -0.5, impl="naive",
                                **config.kernel_kwargs())
    torch.testing.assert_close(out[0:1], ref[0].transpose(0, 1).float(), atol=2e-5, rtol=2e-5)
    from toolkit.kernels.superlinear.attention_spans import span_geometry
    before_spans = decode_positions(3999, span_geometry(config.params(), 4000)).numel()
    assert before_spans == (63 - 3) + 15  # stripes 4..63 (F(i) = i^2 <= 4000) and the 15-key window
    # + at most H_Q * topk spans of 2*ceil(2*sqrt(4000)) + 1 keys; far below the 4,000 a full read takes
    assert reads[0] <= before_spans + HQ * 3 * (2 * 127 + 1) and reads[0] < 4000 // 2


def test_decodes_first_go_through_the_decode_kernel_and_the_rest_through_prefill():
    # vLLM's order: decode requests first (num_decodes of them, one row each), then prompts and chunks.
    config = SuperlinearConfig(sw_index=2, topk=2, forward_factor=1.0)
    seq_lens, query_lens = [97, 260, 150, 300], [1, 1, 150, 64]
    query, starts, block_table, key_cache, value_cache, dense = _paged_batch(seq_lens, query_lens, seed=3)
    scale = D ** -0.5
    kv = _kv(block_table, key_cache, value_cache, seq_lens)
    out = torch.full_like(query, float("nan"))
    superlinear_ragged(query, kv, torch.tensor(starts), config, scale, out, num_decodes=2)
    for r, (n, qn) in enumerate(zip(seq_lens, query_lens)):
        k, v = dense[r]
        q = query[starts[r]:starts[r + 1]].transpose(0, 1)[None]
        ref = superlinear_attention(q, q, k[None], v[None], torch.arange(n - qn, n), scale=scale, impl="naive",
                                    **config.kernel_kwargs())
        torch.testing.assert_close(out[starts[r]:starts[r + 1]], ref[0].transpose(0, 1).float(), atol=2e-5, rtol=2e-5)
