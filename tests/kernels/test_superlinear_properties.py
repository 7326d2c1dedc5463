"""Properties every implementation must have: dense equivalence, chunked == one-shot prefill,
decode == the matching prefill row.  Triton cases run under the interpreter (small sizes)."""

from __future__ import annotations

import pytest
import torch

from toolkit.kernels.superlinear import superlinear_attention, superlinear_decode

from .conftest import dense_causal_reference, left_padding_mask, make_inputs

IMPLS = ["naive", "gather", pytest.param("triton", marks=pytest.mark.triton)]


@pytest.fixture(params=IMPLS)
def impl(request):
    return request.param


@pytest.fixture
def device(impl, request):
    if impl == "triton":
        return request.getfixturevalue("triton_device")
    return "cpu"


def small(impl: str, cpu_len: int, triton_len: int) -> int:
    return triton_len if impl == "triton" else cpu_len


def test_short_context_inside_the_window_equals_dense_causal_attention(impl, device):
    # sw_index 7 -> W = 63: queries 0..62 see only the window, query 63 gets the one key before it.
    length = 64
    q1, q2, k, v = make_inputs(2, 4, 2, length, 32, seed=1, device=device)
    mask = left_padding_mask(2, length, [0, 9], device=device)
    out = superlinear_attention(q1, q2, k, v, attention_mask=mask, sw_index=7, impl=impl)
    ref = dense_causal_reference(q2.cpu(), k.cpu(), v.cpu(), torch.arange(length).expand(2, length), mask.cpu())
    real_rows = mask.cpu()[:, None, :, None].expand_as(ref)
    torch.testing.assert_close(out.cpu().double()[real_rows], ref[real_rows], atol=1e-5, rtol=1e-5)


def test_spans_covering_the_past_equal_dense_causal_attention(impl, device):
    # Factors this large make every selected span [first real key, q - W]: span + window = all keys.
    length = small(impl, 700, 200)
    q1, q2, k, v = make_inputs(2, 4, 1, length, 16, seed=2, device=device)
    mask = left_padding_mask(2, length, [0, 30], device=device)
    out = superlinear_attention(q1, q2, k, v, attention_mask=mask, sw_index=2, topk=2,
                                backward_factor=1e6, forward_factor=1e6, impl=impl)
    ref = dense_causal_reference(q2.cpu(), k.cpu(), v.cpu(), torch.arange(length).expand(2, length), mask.cpu())
    real_rows = mask.cpu()[:, None, :, None].expand_as(ref)
    torch.testing.assert_close(out.cpu().double()[real_rows], ref[real_rows], atol=1e-5, rtol=1e-5)


def test_queries_inside_left_padding_output_zero(impl, device):
    q1, q2, k, v = make_inputs(1, 2, 1, 80, 16, seed=3, device=device)
    mask = left_padding_mask(1, 80, [20], device=device)
    out = superlinear_attention(q1, q2, k, v, attention_mask=mask, sw_index=2, impl=impl)
    assert torch.count_nonzero(out[:, :, :20]) == 0
    assert torch.isfinite(out).all()


def test_chunked_prefill_equals_one_shot(impl, device):
    length = small(impl, 1000, 256)
    q1, q2, k, v = make_inputs(2, 4, 2, length, 32, seed=4, device=device)
    mask = left_padding_mask(2, length, [0, 17], device=device)
    kw = dict(attention_mask=mask, sw_index=3, backward_factor=3.0, forward_factor=1.0, impl=impl)
    whole = superlinear_attention(q1, q2, k, v, **kw)
    cuts = [0, 1, 100, 101, length * 2 // 3, length]
    parts = []
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        # each chunk sees the cache only up to its last position, as during a real chunked prefill
        parts.append(superlinear_attention(q1[:, :, lo:hi], q2[:, :, lo:hi], k[:, :, :hi], v[:, :, :hi],
                                           torch.arange(lo, hi, device=device), **kw))
    torch.testing.assert_close(torch.cat(parts, dim=2), whole, atol=2e-6, rtol=2e-6)


def test_decode_equals_the_prefill_row(impl, device):
    length = small(impl, 900, 300)
    q1, q2, k, v = make_inputs(3, 4, 2, length, 24, seed=5, device=device)
    mask = left_padding_mask(3, length, [0, 5, 60], device=device)
    kw = dict(sw_index=3, backward_factor=3.0, forward_factor=1.0, impl=impl)
    whole = superlinear_attention(q1, q2, k, v, attention_mask=mask, **kw)
    rows = torch.arange(3, device=device)
    for positions in ([length - 1, length - 1, length - 1], [0, 15, 99], [length - 1, 161, 64]):
        pos = torch.tensor(positions, device=device)
        # K/V stay the whole (static) cache: keys after each row's position must not matter
        out = superlinear_decode(q1[rows, :, pos][:, :, None], q2[rows, :, pos][:, :, None], k, v, pos,
                                 attention_mask=mask, **kw)
        torch.testing.assert_close(out[:, :, 0], whole[rows, :, pos], atol=2e-6, rtol=2e-6)


def test_discontiguous_cache_positions_match_their_prefill_rows(impl, device):
    length = small(impl, 600, 200)
    q1, q2, k, v = make_inputs(1, 2, 2, length, 16, seed=6, device=device)
    whole = superlinear_attention(q1, q2, k, v, sw_index=1, impl=impl)
    pos = torch.tensor([3, 40, 41, 42, length - 50, length - 1], device=device)
    out = superlinear_attention(q1[:, :, pos], q2[:, :, pos], k, v, pos, sw_index=1, impl=impl)
    torch.testing.assert_close(out, whole[:, :, pos], atol=2e-6, rtol=2e-6)


def test_search_query_may_be_the_attention_query(impl, device):
    q1, _, k, v = make_inputs(1, 4, 2, 150, 16, seed=7, device=device)
    a = superlinear_attention(q1, q1, k, v, impl=impl)
    b = superlinear_attention(q1, q1.clone(), k, v, impl=impl)
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_key_mask_with_holes_matches_naive(impl, device):
    """Masked keys inside the sequence (not only left padding) are never anchors nor attended."""
    length = small(impl, 500, 128)
    q1, q2, k, v = make_inputs(2, 4, 2, length, 16, seed=8)
    mask = left_padding_mask(2, length, [0, 9])
    mask[0, 40:47] = False
    mask[1, length // 2: length // 2 + 20] = False
    kw = dict(attention_mask=mask, sw_index=2, backward_factor=3.0, forward_factor=1.0)
    ref = superlinear_attention(q1, q2, k, v, **kw, impl="naive")
    dev = [x.to(device) for x in (q1, q2, k, v)]
    out = superlinear_attention(*dev, attention_mask=mask.to(device), sw_index=2, backward_factor=3.0,
                                forward_factor=1.0, impl=impl)
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)
