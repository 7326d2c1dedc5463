"""Superlinear attention over a paged KV cache (``toolkit.kernels.superlinear.paged``), CPU path and Triton.

Every case builds a serving batch (prompts, prefill chunks over a cached prefix, decode rows, idle
requests) whose K/V sit in a shuffled paged cache in one of the engines' layouts, and compares the
paged entry points with the naive reference run request by request over the dense K/V.  Memory the
batch does not own (unused blocks, slots past a request's end) holds NaN, so any read outside a
request's tokens shows up in the output.  Keys and search queries lie on a 1/4 grid: search scores
are exact in every implementation, so all of them select the same spans (ties included).
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.kernels.superlinear.dispatch import superlinear_attention
from toolkit.kernels.superlinear.paged import (
    PagedKV,
    decode_positions,
    layout_from_probe,
    superlinear_attention_paged,
    superlinear_decode_paged,
)
from toolkit.kernels.superlinear.attention_spans import SuperlinearParams, span_geometry

from .conftest import dense_causal_reference, exact_scores_tensor, normal_tensor

LAYOUTS = ("row-major", "vllm-cpu", "permuted", "token-pool")
# Every key of the prefix is in the window or a candidate span up to 168 tokens (docs/superlinear.md).
COVERING = SuperlinearParams(sw_index=7, backward_factor=8.0, forward_factor=8.0)
COVERING_LEN = 168


def kwargs_of(params: SuperlinearParams) -> dict:
    return dict(sw_index=params.sw_index, topk=params.topk, backward_factor=params.backward_factor,
                forward_factor=params.forward_factor, span_power=params.span_power,
                search_power=params.search_power, inv_search_power_int=params.inv_search_power_int)


# --------------------------------------------------------------------------------------------------
# Building paged caches


@dataclass
class Batch:
    kv: PagedKV
    dense: list  # per request (k, v) [H_KV, n, D]
    seq_lens: list[int]
    query_lens: list[int]
    query_start: list[int]
    query: torch.Tensor  # [T, H_Q, D] attention query
    search_query: torch.Tensor  # [T, H_Q, D] on the exact grid


def _write_block_cache(storage_k, storage_v, perm_k, perm_v, block_ids, dense, block_size):
    """Write each request's tokens into its blocks through the layouts (flat (block, head) pages)."""
    for (k, v), blocks in zip(dense, block_ids):
        n = k.shape[1]
        for t in range(n):
            blk, off = int(blocks[t // block_size]), t % block_size
            for page, perm, x in ((storage_k, perm_k, k), (storage_v, perm_v, v)):
                dim = x.shape[2]
                slots = torch.arange(off * dim, (off + 1) * dim) if perm is None else perm[off * dim:(off + 1) * dim]
                page[blk][:, slots] = x[:, t]


def build_batch(seq_lens, query_lens, kv_heads, heads, dim, block_size, layout, seed, same_query=False,
                dtype=torch.float32) -> Batch:
    g = torch.Generator().manual_seed(seed)
    dense = [(exact_scores_tensor((kv_heads, n, dim), g), normal_tensor((kv_heads, n, dim), g)) for n in seq_lens]
    num_req = len(seq_lens)
    if layout == "token-pool":
        block_size = 1
    need = [-(-n // block_size) for n in seq_lens]
    spare = 3
    num_blocks = sum(need) + spare
    order = torch.randperm(num_blocks, generator=g)
    tables, at = [], 0
    for nb in need:
        tables.append(order[at:at + nb])
        at += nb
    unused = order[at:]  # blocks nobody owns: NaN, and what unused table entries point to
    width = max(need + [1]) + 2
    rows = num_req + 2 if layout == "token-pool" else num_req
    # Non-contiguous table (a column slice of a wider tensor), unused entries on NaN blocks.
    wide = unused[torch.randint(0, spare, (rows, width + 3), generator=g)].to(torch.int32)
    table = wide[:, 1:1 + width]
    table_rows = torch.randperm(rows, generator=g)[:num_req] if layout == "token-pool" else torch.arange(num_req)
    for r, t in enumerate(tables):
        table[table_rows[r], :len(t)] = t.to(torch.int32)
    nan = float("nan")
    seq = torch.tensor(seq_lens, dtype=torch.int64)
    if layout == "token-pool":
        k_pool = torch.full((num_blocks, kv_heads, dim), nan)
        v_pool = torch.full((num_blocks, kv_heads, dim), nan)
        for r, (k, v) in enumerate(dense):
            slots = tables[r].long()
            k_pool[slots] = k.transpose(0, 1)
            v_pool[slots] = v.transpose(0, 1)
        kv = PagedKV.from_token_pool(k_pool.to(dtype), v_pool.to(dtype), table, table_rows, seq)
    else:
        n = block_size * dim
        transposed = (torch.arange(dim)[None, :] * block_size + torch.arange(block_size)[:, None]).reshape(-1)
        if layout == "row-major":
            key_cache = torch.full((num_blocks, kv_heads, block_size, dim), nan)
            value_cache = torch.full((num_blocks, kv_heads, block_size, dim), nan)
            k_perm = v_perm = None
        else:
            # vLLM's CPU cache: [blocks, H, bs, 2D], a block's keys then its values; "vllm-cpu" stores
            # keys transposed (the vec kernels), "permuted" any order (read through the table).
            storage = torch.full((num_blocks, kv_heads, block_size, 2 * dim), nan)
            key_cache, value_cache = storage.view(num_blocks, kv_heads, 2 * block_size, dim).chunk(2, dim=2)
            k_perm = transposed if layout == "vllm-cpu" else torch.randperm(n, generator=g)
            v_perm = None if layout == "vllm-cpu" else transposed
        _write_block_cache(key_cache.view(num_blocks, kv_heads, n), value_cache.view(num_blocks, kv_heads, n),
                           k_perm, v_perm, tables, dense, block_size)
        kv = PagedKV.from_blocks(key_cache.to(dtype) if dtype != torch.float32 else key_cache,
                                 value_cache.to(dtype) if dtype != torch.float32 else value_cache,
                                 table, seq, k_perm, v_perm)
    total = sum(query_lens)
    search_query = exact_scores_tensor((total, heads, dim), g)
    query = search_query if same_query else normal_tensor((total, heads, dim), g)
    starts = [0]
    for c in query_lens:
        starts.append(starts[-1] + c)
    dense = [(k.to(dtype), v.to(dtype)) for k, v in dense]
    return Batch(kv, dense, list(seq_lens), list(query_lens), starts, query.to(dtype), search_query.to(dtype))


def reference_rows(batch: Batch, params: SuperlinearParams, decode: bool = False) -> torch.Tensor:
    """Naive reference request by request over the dense K/V: ``[T, H_Q, D]`` (NaN where no row)."""
    out = torch.full_like(batch.query, float("nan"))
    for r, (n, count) in enumerate(zip(batch.seq_lens, batch.query_lens)):
        lo, hi = (r, r + 1) if decode else (batch.query_start[r], batch.query_start[r + 1])
        if count == 0 or n == 0:
            continue
        k, v = batch.dense[r]
        q1 = batch.search_query[lo:hi].transpose(0, 1)[None]
        q2 = batch.query[lo:hi].transpose(0, 1)[None]
        ref = superlinear_attention(q1, q2, k[None], v[None], torch.arange(n - count, n), impl="naive",
                                    **kwargs_of(params))
        out[lo:hi] = ref[0].transpose(0, 1)
    return out


# --------------------------------------------------------------------------------------------------
# Strategies


@st.composite
def params_strategy(draw):
    power = draw(st.sampled_from(["int2", "int2", "int3", "float0.55"]))
    search = ({"inv_search_power_int": int(power[3:])} if power.startswith("int")
              else {"search_power": float(power[5:])})
    return SuperlinearParams(
        sw_index=draw(st.integers(0, 3)), topk=draw(st.integers(1, 4)),
        backward_factor=draw(st.sampled_from([1.0, 2.0, 3.0])),
        forward_factor=draw(st.sampled_from([0.0, 0.0, 1.0])),
        span_power=draw(st.sampled_from([0.5, 0.5, 2 / 3])), **search)


@st.composite
def batch_strategy(draw, max_len: int, max_requests: int, decode_only: bool = False):
    """Keyword arguments of ``build_batch`` plus params: a mix of request kinds and cache layouts."""
    layout = draw(st.sampled_from(LAYOUTS))
    block_size = 1 if layout == "token-pool" else draw(st.sampled_from([1, 4, 16, 32]))
    kv_heads = draw(st.sampled_from([1, 2]))
    group = draw(st.sampled_from([1, 2, 4]))
    dim = draw(st.sampled_from([32, 64, 80]))  # 80: not a power of two (masked lanes)
    seq_lens, query_lens = [], []
    for _ in range(draw(st.integers(1, max_requests))):
        kind = "decode" if decode_only else draw(st.sampled_from(["prompt", "chunk", "decode", "decode", "idle"]))
        n = draw(st.integers(1, max_len))
        count = {"prompt": n, "chunk": draw(st.integers(1, n)), "decode": 1, "idle": 0}[kind]
        seq_lens.append(n)
        query_lens.append(count)
    return dict(seq_lens=seq_lens, query_lens=query_lens, kv_heads=kv_heads, heads=kv_heads * group, dim=dim,
                block_size=block_size, layout=layout, seed=draw(st.integers(0, 2**16)),
                same_query=draw(st.booleans())), draw(params_strategy())


HYPOTHESIS = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def _assert_rows(out, ref, rows):
    torch.testing.assert_close(out[rows], ref[rows], atol=1e-5, rtol=1e-5)


# --------------------------------------------------------------------------------------------------
# Reads


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_reads_return_each_requests_tokens_in_every_layout(layout, block_size):
    batch = build_batch([37, 70, 5], [0, 0, 0], 2, 2, 32, block_size, layout, seed=block_size)
    for r, (k, v) in enumerate(batch.dense):
        n = k.shape[1]
        rk, rv = batch.kv.read_prefix(r, n)
        assert torch.equal(rk, k) and torch.equal(rv, v)
        some = torch.randperm(n)[: max(1, n // 3)]
        pk, pv = batch.kv.read_positions(r, some)
        assert torch.equal(pk, k[:, some]) and torch.equal(pv, v[:, some])


def test_probe_learns_vllm_transposed_keys_and_the_kernels_get_strides():
    bs, dim = 16, 32

    def transposed_write(k, v, key_cache, value_cache, slots):  # like vLLM's CPU "vec" kernels
        for i, s in enumerate(slots.tolist()):
            blk, off = divmod(s, bs)
            key_cache[blk].reshape(key_cache.shape[1], -1).view(key_cache.shape[1], dim, bs)[:, :, off] = k[i]
            value_cache[blk, :, off] = v[i]

    k_perm, v_perm = layout_from_probe(transposed_write, bs, dim, torch.float32)
    assert v_perm is None
    batch = build_batch([40], [0], 1, 1, dim, bs, "vllm-cpu", seed=3)
    assert torch.equal(k_perm, batch.kv.key_perm)
    layout = batch.kv.inner_layout("key")
    assert (layout.stride_token, layout.stride_dim, layout.perm) == (1, bs, None)  # affine: strides
    assert batch.kv.inner_layout("value").perm is None
    permuted = build_batch([40], [0], 1, 1, dim, bs, "permuted", seed=3)
    assert permuted.kv.inner_layout("key").perm is not None  # general: read through the table


def test_paged_kv_rejects_inconsistent_shapes():
    k = torch.zeros(4, 2, 16, 32)
    with pytest.raises(ValueError, match="block_table"):
        PagedKV.from_blocks(k, k, torch.zeros(3, dtype=torch.int32), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match="key_perm"):
        PagedKV.from_blocks(k, k, torch.zeros(3, 2, dtype=torch.int32), torch.tensor([1, 2, 3]),
                            key_perm=torch.arange(7))
    with pytest.raises(ValueError, match="token pools"):
        PagedKV.from_token_pool(k, k, torch.zeros(3, 2, dtype=torch.int32), torch.arange(3), torch.ones(3))
    kv = PagedKV.from_blocks(k, k, torch.zeros(1, 2, dtype=torch.int32), torch.tensor([5]))
    with pytest.raises(ValueError, match="multiple of H_KV"):
        superlinear_attention_paged(torch.zeros(5, 3, 32), kv, [0, 5])
    with pytest.raises(ValueError, match="only 5 cached tokens"):
        superlinear_attention_paged(torch.zeros(6, 2, 32), kv, [0, 6])


# --------------------------------------------------------------------------------------------------
# CPU path (gather) against the naive reference


@settings(max_examples=30, **HYPOTHESIS)
@given(case=batch_strategy(max_len=260, max_requests=4))
def test_paged_gather_matches_naive_per_request(case):
    spec, params = case
    batch = build_batch(**spec)
    out = superlinear_attention_paged(batch.query, batch.kv, batch.query_start, batch.search_query,
                                      impl="gather", **kwargs_of(params))
    rows = torch.arange(batch.query.shape[0])
    _assert_rows(out, reference_rows(batch, params), rows)


@settings(max_examples=15, **HYPOTHESIS)
@given(case=batch_strategy(max_len=300, max_requests=4, decode_only=True))
def test_paged_gather_decode_matches_naive(case):
    spec, params = case
    batch = build_batch(**spec)
    out = superlinear_decode_paged(batch.query, batch.kv, batch.search_query, impl="gather", **kwargs_of(params))
    _assert_rows(out, reference_rows(batch, params, decode=True), torch.arange(out.shape[0]))


def test_paged_gather_decode_reads_only_stripes_window_and_spans():
    params = SuperlinearParams(sw_index=3)
    batch = build_batch([4000, 60], [1, 1], 2, 4, 32, 16, "vllm-cpu", seed=2, same_query=True)
    reads = {}

    class Counting(PagedKV):
        def read_positions(self, r, positions):
            reads[r] = reads.get(r, 0) + positions.numel()
            return super().read_positions(r, positions)

        def read_prefix(self, r, n):
            raise AssertionError("decode must not read a whole prefix")

    kv = batch.kv
    counting = Counting(kv.key_cache, kv.value_cache, kv.block_table, kv.seq_lens, kv.table_rows,
                        kv.key_perm, kv.value_perm)
    out = superlinear_decode_paged(batch.query, counting, impl="gather", **kwargs_of(params))
    _assert_rows(out, reference_rows(batch, params, decode=True), torch.arange(2))
    before_spans = decode_positions(3999, span_geometry(params, 4000)).numel()
    assert before_spans == (63 - 3) + 15  # stripes 4..63 and the 15-key window
    assert reads[0] <= before_spans + 4 * 3 * (2 * 127 + 1) and reads[0] < 4000 // 2


# --------------------------------------------------------------------------------------------------
# Triton kernels (interpreted on CPU) against the naive reference


def test_paged_kernels_run_in_the_interpreter(triton_device):
    if triton_device != "cpu":
        pytest.skip("native run")
    from toolkit.kernels.superlinear.triton import paged_decode, paged_prefill

    for kernel in (paged_prefill._paged_search_kernel, paged_prefill._paged_span_tile_kernel,
                   paged_prefill._paged_merge_kernel, paged_decode._paged_decode_search_kernel,
                   paged_decode._paged_decode_span_kernel):
        assert type(kernel).__name__ == "InterpretedFunction"


def _map_kv(kv: PagedKV, fn) -> PagedKV:
    fields = ("key_cache", "value_cache", "block_table", "seq_lens", "table_rows", "key_perm", "value_perm")
    return PagedKV(*(None if getattr(kv, f) is None else fn(getattr(kv, f)) for f in fields))


def _on(batch: Batch, device: str) -> Batch:
    if device == "cpu":
        return batch
    kv = _map_kv(batch.kv, lambda x: x.to(device))
    return Batch(kv, batch.dense, batch.seq_lens, batch.query_lens, batch.query_start,
                 batch.query.to(device), batch.search_query.to(device))


@settings(max_examples=25, **HYPOTHESIS)
@given(case=batch_strategy(max_len=200, max_requests=3))
def test_paged_triton_prefill_matches_naive_per_request(case, triton_device):
    spec, params = case
    batch = build_batch(**spec)
    dev = _on(batch, triton_device)
    # A padding row past the last request's rows (a CUDA-graph batch) must come out 0.
    pad = lambda x: torch.cat([x, torch.randn(1, *x.shape[1:]).to(x)])  # noqa: E731
    out = superlinear_attention_paged(pad(dev.query), dev.kv, torch.tensor(batch.query_start, device=triton_device),
                                      pad(dev.search_query), impl="triton", **kwargs_of(params)).cpu()
    rows = torch.arange(batch.query.shape[0])
    _assert_rows(out, reference_rows(batch, params), rows)
    assert torch.equal(out[-1], torch.zeros_like(out[-1]))


@settings(max_examples=14, **HYPOTHESIS)
@given(case=batch_strategy(max_len=400, max_requests=4, decode_only=True))
def test_paged_triton_decode_matches_naive(case, triton_device):
    spec, params = case
    batch = build_batch(**spec)
    dev = _on(batch, triton_device)
    out = superlinear_decode_paged(dev.query, dev.kv, dev.search_query, impl="triton", **kwargs_of(params)).cpu()
    _assert_rows(out, reference_rows(batch, params, decode=True), torch.arange(out.shape[0]))


def test_paged_triton_decode_padding_rows_and_a_static_bound(triton_device):
    # seq_len 0 = a padding row of a captured batch: output 0, nothing read; max_seq_len above
    # every request (the graph's static bound) gives the same result as the table's capacity.
    params = SuperlinearParams(sw_index=2, topk=2, forward_factor=1.0)
    batch = build_batch([90, 1, 33], [1, 1, 1], 2, 4, 32, 16, "vllm-cpu", seed=5)
    kv = batch.kv
    padded = PagedKV(kv.key_cache, kv.value_cache, kv.block_table, torch.tensor([90, 0, 33]), kv.table_rows,
                     kv.key_perm, kv.value_perm)
    dev = _on(batch, triton_device)
    dev_kv = _on(Batch(padded, batch.dense, batch.seq_lens, batch.query_lens, batch.query_start, batch.query,
                       batch.search_query), triton_device).kv
    ref = reference_rows(batch, params, decode=True)
    for max_seq_len in (None, 4096):
        out = superlinear_decode_paged(dev.query, dev_kv, dev.search_query, impl="triton", max_seq_len=max_seq_len,
                                       **kwargs_of(params)).cpu()
        _assert_rows(out, ref, torch.tensor([0, 2]))
        assert torch.equal(out[1], torch.zeros_like(out[1]))
    cpu = superlinear_decode_paged(batch.query, padded, batch.search_query, impl="gather", **kwargs_of(params))
    assert torch.equal(cpu[1], torch.zeros_like(cpu[1]))


# --------------------------------------------------------------------------------------------------
# Covering regime: every path equals dense causal attention


@pytest.mark.parametrize("layout, block_size", [("vllm-cpu", 16), ("token-pool", 1), ("permuted", 32)])
def test_covering_regime_equals_dense_attention(layout, block_size, triton_device):
    n = COVERING_LEN
    seq_lens, query_lens = [n, n - 40, 100, n], [n, 30, 1, 1]
    batch = build_batch(seq_lens, query_lens, 2, 4, 32, block_size, layout, seed=7, same_query=True)
    g = torch.Generator().manual_seed(8)
    batch.query = batch.search_query = normal_tensor(batch.query.shape, g)  # continuous data
    expected = torch.empty_like(batch.query)
    for r, (m, count) in enumerate(zip(seq_lens, query_lens)):
        k, v = batch.dense[r]
        lo, hi = batch.query_start[r], batch.query_start[r + 1]
        q = batch.query[lo:hi].transpose(0, 1)[None]
        ref = dense_causal_reference(q, k[None], v[None], torch.arange(m - count, m)[None], None)
        expected[lo:hi] = ref[0].transpose(0, 1).float()
    kw = kwargs_of(COVERING)
    rows = torch.arange(batch.query.shape[0])
    _assert_rows(superlinear_attention_paged(batch.query, batch.kv, batch.query_start, impl="gather", **kw),
                 expected, rows)
    dev = _on(batch, triton_device)
    out = superlinear_attention_paged(dev.query, dev.kv, batch.query_start, impl="triton", **kw).cpu()
    _assert_rows(out, expected, rows)
    decode_rows = [2, 3]
    sub = PagedKV(batch.kv.key_cache, batch.kv.value_cache, batch.kv.block_table,
                  batch.kv.seq_lens[decode_rows], torch.tensor(decode_rows) if batch.kv.table_rows is None
                  else batch.kv.table_rows[decode_rows], batch.kv.key_perm, batch.kv.value_perm)
    q_dec = batch.query[[batch.query_start[r] for r in decode_rows]]
    for impl in ("gather", "triton"):
        d = "cpu" if impl == "gather" else triton_device
        sub_d = _on(Batch(sub, [], [], [], [], q_dec, q_dec), d)
        res = superlinear_decode_paged(sub_d.query, sub_d.kv, impl=impl, **kw).cpu()
        torch.testing.assert_close(res, expected[[batch.query_start[r] for r in decode_rows]], atol=1e-5, rtol=1e-5)


def test_paged_triton_bf16_on_gpu(triton_device):
    """16-bit inputs need real tensor cores: the interpreter multiplies bf16 bit patterns."""
    if triton_device != "cuda":
        pytest.skip("16-bit dot products are not faithful under the Triton interpreter")
    params = SuperlinearParams(sw_index=3, backward_factor=3.0, forward_factor=1.0)
    batch = build_batch([1500, 900, 700], [1500, 128, 1], 2, 8, 128, 16, "row-major", seed=1, dtype=torch.bfloat16)
    dev = _on(batch, "cuda")
    out = superlinear_attention_paged(dev.query, dev.kv, batch.query_start, dev.search_query, impl="triton",
                                      **kwargs_of(params)).cpu().float()
    ref = reference_rows(batch, params).float()
    torch.testing.assert_close(out, ref, atol=2e-2, rtol=2e-2)


def test_paged_triton_reads_a_probed_layout_made_in_inference_mode(triton_device):
    # vLLM runs forward under torch.inference_mode(): the layout tables the probe makes there are
    # inference tensors (no version counter), and the kernels' stride analysis must take them.
    params = SuperlinearParams(sw_index=2, topk=2)
    batch = build_batch([70, 40], [70, 1], 2, 4, 32, 16, "vllm-cpu", seed=4)
    kv = batch.kv
    with torch.inference_mode():
        perm = kv.key_perm.clone()
        inferred = PagedKV(kv.key_cache, kv.value_cache, kv.block_table, kv.seq_lens, kv.table_rows, perm, None)
        dev = _on(Batch(inferred, batch.dense, batch.seq_lens, batch.query_lens, batch.query_start, batch.query,
                        batch.search_query), triton_device)
        out = superlinear_attention_paged(dev.query, dev.kv, batch.query_start, dev.search_query, impl="triton",
                                          **kwargs_of(params)).cpu()
    _assert_rows(out, reference_rows(batch, params), torch.arange(batch.query.shape[0]))


@st.composite
def serving_batch_strategy(draw):
    """A batch as vLLM hands it over: single-token requests first (``num_decodes`` of them)."""
    spec, params = draw(batch_strategy(max_len=200, max_requests=4))
    order = sorted(range(len(spec["seq_lens"])), key=lambda r: spec["query_lens"][r] != 1)
    spec["seq_lens"] = [spec["seq_lens"][r] for r in order]
    spec["query_lens"] = [spec["query_lens"][r] for r in order]
    num_decodes = 0
    while num_decodes < len(order) and spec["query_lens"][num_decodes] == 1:
        num_decodes += 1
    return spec, params, num_decodes


@settings(max_examples=15, **HYPOTHESIS)
@given(case=serving_batch_strategy())
def test_serving_batch_triton_equals_gather_path(case, triton_device):
    # The engines' entry (patches/common/superlinear/ragged.py): decode rows through the decode kernel,
    # the rest through the prefill kernel, on both paths, over every layout and block size.
    from toolkit.patches.common.superlinear.config import SuperlinearConfig
    from toolkit.patches.common.superlinear.ragged import superlinear_ragged

    spec, params, num_decodes = case
    spec["same_query"] = True  # the engines search with the attention query
    batch = build_batch(**spec)
    fields = kwargs_of(params)
    scale = spec["dim"] ** -0.5
    gather = torch.full_like(batch.query, float("nan"))
    superlinear_ragged(batch.query, batch.kv, batch.query_start, SuperlinearConfig(**fields, impl="gather"), scale,
                       gather, num_decodes=num_decodes)
    dev = _on(batch, triton_device)
    triton = torch.full_like(dev.query, float("nan"))
    superlinear_ragged(dev.query, dev.kv, torch.tensor(batch.query_start, device=triton_device),
                       SuperlinearConfig(**fields, impl="triton"), scale, triton, num_decodes=num_decodes)
    rows = torch.tensor([t for r, c in enumerate(batch.query_lens) for t in range(batch.query_start[r],
                                                                                 batch.query_start[r] + c)])
    if rows.numel():
        _assert_rows(triton.cpu(), gather, rows)
        _assert_rows(gather, reference_rows(batch, params), rows)


@pytest.mark.parametrize("layout, block_size", [("row-major", 16), ("token-pool", 1)])
def test_paged_triton_decode_reads_no_request_data_on_the_host(layout, block_size, triton_device):
    # The CUDA-graph condition, checkable on CPU: every tensor of the step is RequestData, so any
    # .item()/.tolist()/int()/bool() of it (or of anything computed from it) raises.
    from tests.harness.host_reads import plain, request_data

    params = SuperlinearParams(sw_index=2, topk=2, forward_factor=1.0)
    batch = build_batch([150, 33, 90], [1, 1, 1], 2, 4, 32, block_size, layout, seed=6)
    dev = _on(batch, triton_device)
    superlinear_decode_paged(dev.query, dev.kv, dev.search_query, impl="triton", **kwargs_of(params))  # tables first
    out = superlinear_decode_paged(request_data(dev.query), _map_kv(dev.kv, request_data), request_data(dev.search_query),
                                   impl="triton", **kwargs_of(params))
    _assert_rows(plain(out).cpu(), reference_rows(batch, params, decode=True), torch.arange(3))
    with pytest.raises(AssertionError, match="read on the host"):  # the guard works: the CPU path reads
        superlinear_decode_paged(request_data(batch.query), _map_kv(batch.kv, request_data), impl="gather",
                                 **kwargs_of(params))
