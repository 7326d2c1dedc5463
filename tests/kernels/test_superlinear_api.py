"""The public API: dispatch, argument checking, search results."""

from __future__ import annotations

import pytest
import torch

from toolkit.kernels.superlinear import (
    SuperlinearParams,
    resolve_impl,
    superlinear_attention,
    superlinear_decode,
    superlinear_search,
)

from .conftest import left_padding_mask, make_inputs


def test_auto_picks_the_gather_implementation_on_cpu(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert resolve_impl("auto", torch.device("cpu")) == "gather"
    assert resolve_impl(None, torch.device("cpu")) == "gather"
    with pytest.raises(RuntimeError, match="CUDA"):
        resolve_impl("triton", torch.device("cpu"))
    with pytest.raises(ValueError, match="impl must be one of"):
        resolve_impl("flash", torch.device("cpu"))


def test_explicit_override_selects_the_implementation():
    q1, q2, k, v = make_inputs(1, 2, 1, 120, 16, seed=1)
    naive = superlinear_attention(q1, q2, k, v, sw_index=2, impl="naive")
    gather = superlinear_attention(q1, q2, k, v, sw_index=2, impl="gather")
    auto = superlinear_attention(q1, q2, k, v, sw_index=2)
    torch.testing.assert_close(gather, naive, atol=1e-5, rtol=1e-5)
    assert torch.equal(auto, gather)


def test_search_results_agree_between_implementations():
    q1, _, k, _ = make_inputs(2, 4, 2, 300, 16, seed=2)
    mask = left_padding_mask(2, 300, [0, 40])
    kw = dict(attention_mask=mask, sw_index=3, backward_factor=3.0, forward_factor=1.0)
    a = superlinear_search(q1, k, **kw, impl="naive")
    b = superlinear_search(q1, k, **kw, impl="gather")
    for x, y in zip(a, b):
        assert torch.equal(x, y.to(x.dtype))
    assert a.anchor.shape == (2, 4, 300, 3)
    assert bool((a.anchor[1][a.anchor[1] >= 0] >= 40).all())  # padded keys are never anchors
    # anchors sit on stripes: q + 1 - anchor is a perfect square >= (sw_index + 1)^2
    q = torch.arange(300).view(1, 1, 300, 1).expand_as(a.anchor)
    dist = (q + 1 - a.anchor)[a.anchor >= 0]
    root = dist.double().sqrt().round().long()
    assert torch.equal(root * root, dist) and bool((root >= 4).all())


def test_decode_accepts_one_shared_position_or_one_per_row():
    q1, q2, k, v = make_inputs(2, 2, 1, 64, 16, seed=3)
    shared = superlinear_decode(q1[:, :, 40:41], q2[:, :, 40:41], k, v, 40)
    per_row = superlinear_decode(q1[:, :, 40:41], q2[:, :, 40:41], k, v, torch.tensor([40, 40]))
    assert torch.equal(shared, per_row)
    assert shared.shape == (2, 2, 1, 16)


@pytest.mark.parametrize("change, message", [
    (lambda q1, q2, k, v: (q1, q2, k[:, :1].expand(-1, 3, -1, -1), v[:, :1].expand(-1, 3, -1, -1)), "multiple"),
    (lambda q1, q2, k, v: (q1, q2[..., :8], k, v), "same shape"),
    (lambda q1, q2, k, v: (q1, q2, k, v[:, :, :10]), "same shape"),
    (lambda q1, q2, k, v: (q1[0], q2[0], k[0], v[0]), "4-D"),
    (lambda q1, q2, k, v: (q1.double(), q2.double(), k.double(), v.double()), "not supported"),
])
def test_bad_shapes_and_dtypes_raise_clear_errors(change, message):
    args = change(*make_inputs(1, 2, 1, 32, 16, seed=4))
    with pytest.raises(ValueError, match=message):
        superlinear_attention(*args)


def test_head_dim_above_256_is_rejected():
    q1, q2, k, v = make_inputs(1, 1, 1, 8, 264, seed=5)
    with pytest.raises(ValueError, match="256"):
        superlinear_attention(q1, q2, k, v)


def test_decode_needs_one_query_per_row():
    q1, q2, k, v = make_inputs(1, 2, 1, 32, 16, seed=6)
    with pytest.raises(ValueError, match="one query per row"):
        superlinear_decode(q1, q2, k, v, 31)


def test_bad_mask_and_positions_are_rejected():
    q1, q2, k, v = make_inputs(2, 2, 1, 32, 16, seed=7)
    with pytest.raises(ValueError, match="attention_mask"):
        superlinear_attention(q1, q2, k, v, attention_mask=torch.ones(2, 16, dtype=torch.bool))
    with pytest.raises(ValueError, match="cache_position"):
        superlinear_attention(q1, q2, k, v, cache_position=torch.arange(5))
    with pytest.raises(ValueError, match="cache_position"):
        superlinear_attention(q1, q2, k, v, cache_position=torch.arange(10, 42))
    with pytest.raises(ValueError, match="cache_position"):
        superlinear_decode(q1[:, :, :1], q2[:, :, :1], k, v, torch.tensor([3, 32]))


def test_parameters_reach_the_implementation():
    q1, q2, k, v = make_inputs(1, 2, 1, 200, 16, seed=8)
    a = superlinear_attention(q1, q2, k, v, topk=1)
    b = superlinear_attention(q1, q2, k, v, topk=3)
    assert not torch.allclose(a, b)
    with pytest.raises(ValueError, match="either"):
        superlinear_attention(q1, q2, k, v, search_power=0.5, inv_search_power_int=2)
    assert SuperlinearParams().topk == 3
