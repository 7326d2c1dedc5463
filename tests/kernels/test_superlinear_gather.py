"""The gather implementation (CPU path) against the dense-mask reference, on random cases."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toolkit.kernels.superlinear.gather import gather_superlinear_attention, gather_superlinear_decode
from toolkit.kernels.superlinear.naive import naive_superlinear_attention
from toolkit.kernels.superlinear.attention_spans import SuperlinearParams

from .conftest import left_padding_mask, make_inputs, normal_tensor


@st.composite
def params_strategy(draw):
    power = draw(st.sampled_from(["int2", "int2", "int3", "float0.55", "float0.45"]))
    search = {}
    if power.startswith("int"):
        search["inv_search_power_int"] = int(power[3:])
    else:
        search["search_power"] = float(power[5:])
    return SuperlinearParams(
        sw_index=draw(st.integers(0, 4)),
        topk=draw(st.integers(1, 4)),
        backward_factor=draw(st.sampled_from([0.5, 1.0, 1.5, 2.0, 2.7, 3.0])),
        forward_factor=draw(st.sampled_from([0.0, 0.0, 0.5, 1.0])),
        span_power=draw(st.sampled_from([0.5, 0.5, 0.4, 2 / 3])),
        **search,
    )


@st.composite
def case_strategy(draw):
    length = draw(st.one_of(st.integers(1, 160), st.integers(160, 1200), st.sampled_from([2048, 3000])))
    big = length > 1200
    batch = draw(st.integers(1, 1 if big else 2))
    kv_heads = draw(st.integers(1, 2))
    group = draw(st.sampled_from([1, 2] if big else [1, 2, 4]))
    dim = draw(st.sampled_from([8, 16, 24, 32, 64]))
    pads = [draw(st.integers(0, length // 2)) for _ in range(batch)] if draw(st.booleans()) else None
    # Queries: the whole sequence, or a chunk [first, first + n) of a longer cache.
    if draw(st.booleans()):
        first, count = 0, length
    else:
        first = draw(st.integers(0, length - 1))
        count = draw(st.integers(1, length - first))
    return dict(batch=batch, heads=kv_heads * group, kv_heads=kv_heads, length=length, dim=dim,
                pads=pads, first=first, count=count, params=draw(params_strategy()),
                same_query=draw(st.booleans()), seed=draw(st.integers(0, 2**16)))


def run_both(case, dtype=torch.float32):
    q1, q2, k, v = make_inputs(case["batch"], case["heads"], case["kv_heads"], case["length"], case["dim"],
                               seed=case["seed"], dtype=dtype, same_query=case["same_query"])
    lo, hi = case["first"], case["first"] + case["count"]
    q1, q2 = q1[:, :, lo:hi], q2[:, :, lo:hi]
    positions = torch.arange(lo, hi)
    mask = None if case["pads"] is None else left_padding_mask(case["batch"], case["length"], case["pads"])
    ref, ref_search = naive_superlinear_attention(q1, q2, k, v, positions, mask, case["params"], return_search=True)
    out, search = gather_superlinear_attention(q1, q2, k, v, positions, mask, case["params"], return_search=True)
    return ref, ref_search, out, search


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=case_strategy())
def test_gather_matches_naive_fp32(case):
    ref, ref_search, out, search = run_both(case)
    for name, a, b in zip(("anchor", "score", "span_start", "span_end"), ref_search, search):
        assert torch.equal(a, b.to(a.dtype)), name
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=case_strategy())
def test_gather_matches_naive_bf16(case):
    ref, ref_search, out, search = run_both(case, dtype=torch.bfloat16)
    assert torch.equal(ref_search[0], search[0])
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_gather_matches_naive_fp16():
    case = dict(batch=2, heads=4, kv_heads=2, length=500, dim=32, pads=[0, 41], first=0, count=500,
                params=SuperlinearParams(sw_index=2), same_query=False, seed=3)
    ref, _, out, _ = run_both(case, dtype=torch.float16)
    torch.testing.assert_close(out.float(), ref.float(), atol=2e-2, rtol=2e-2)


def test_gather_on_normal_data_differs_only_at_near_ties():
    """On continuous data, fp32 scores can differ in the last bit between a dense matmul and a
    gathered one, so a near-tie may flip a selection: every row either selects the same anchors
    and matches to 1e-5, or the flipped candidates' scores agree to fp32 rounding."""
    g = torch.Generator().manual_seed(7)
    b, h, hk, L, d = 1, 4, 2, 1500, 64
    q = normal_tensor((b, h, L, d), g)
    k = normal_tensor((b, hk, L, d), g)
    v = normal_tensor((b, hk, L, d), g)
    params = SuperlinearParams(sw_index=3, backward_factor=3.0, forward_factor=1.0)
    ref, (ra, rs, _, _) = naive_superlinear_attention(q, q, k, v, None, None, params, return_search=True)
    out, (ga, gs, _, _) = gather_superlinear_attention(q, q, k, v, None, None, params, return_search=True)
    same = (ra.sort(-1).values == ga.sort(-1).values).all(-1)
    assert same.float().mean() > 0.999
    torch.testing.assert_close(out[same], ref[same], atol=1e-5, rtol=1e-5)
    # where they differ, the k-th best scores are equal up to rounding
    kth_ref = rs[~same].min(-1).values
    kth_gather = gs[~same].min(-1).values
    assert bool(((kth_ref - kth_gather).abs() <= 1e-4 * kth_ref.abs().clamp(min=1)).all())
    torch.testing.assert_close(gs[same], rs[same], atol=1e-4, rtol=1e-5)


def test_gather_decode_matches_naive_rows_for_a_batch_of_lengths():
    q1, q2, k, v = make_inputs(3, 8, 2, 700, 32, seed=11)
    mask = left_padding_mask(3, 700, [0, 13, 200])
    params = SuperlinearParams(sw_index=3, backward_factor=3.0, forward_factor=1.0)
    ref = naive_superlinear_attention(q1, q2, k, v, None, mask, params)
    pos = torch.tensor([699, 350, 205])
    rows = torch.arange(3)
    out = gather_superlinear_decode(q1[rows, :, pos][:, :, None], q2[rows, :, pos][:, :, None], k, v, pos, mask, params)
    torch.testing.assert_close(out[:, :, 0], ref[rows, :, pos], atol=1e-5, rtol=1e-5)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=case_strategy(), block=st.integers(1, 97))
def test_search_in_small_query_blocks_matches_naive(case, block):
    """The torch search scores each block of queries on only as many stripes as the block's last
    query has: blocks much smaller than the chunk (so their stripe counts differ) change nothing.
    (The compiled search, ``test_superlinear_native.py``, is turned off here.)"""
    import os

    import toolkit.kernels.superlinear.gather.search as search

    saved = search.QUERY_BLOCK, os.environ.get("TOOLKIT_SUPERLINEAR_NATIVE")
    search.QUERY_BLOCK = block
    os.environ["TOOLKIT_SUPERLINEAR_NATIVE"] = "0"
    try:
        ref, ref_search, out, search_result = run_both(case)
    finally:
        search.QUERY_BLOCK = saved[0]
        if saved[1] is None:
            os.environ.pop("TOOLKIT_SUPERLINEAR_NATIVE", None)
        else:
            os.environ["TOOLKIT_SUPERLINEAR_NATIVE"] = saved[1]
    for name, a, b in zip(("anchor", "score", "span_start", "span_end"), ref_search, search_result):
        assert torch.equal(a, b.to(a.dtype)), name
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
