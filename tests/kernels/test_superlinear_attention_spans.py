"""Exact-integer span arithmetic (kernels/superlinear/attention_spans.py)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.kernels.superlinear.attention_spans import (
    SuperlinearParams,
    ceil_scaled_power,
    floor_root,
    span_bounds,
    span_geometry,
    stripe_distance,
)


def brute_ceil(factor: float, t: int, power: Fraction) -> int:
    """Smallest m >= 0 with m >= factor * t**power, by exact rational comparison of m**den."""
    target = Fraction(factor) ** power.denominator * Fraction(t) ** power.numerator
    lo, hi = 0, 1
    while Fraction(hi) ** power.denominator < target:
        hi *= 2
    while lo < hi:  # smallest m in [lo, hi] with m**den >= target
        mid = (lo + hi) // 2
        if Fraction(mid) ** power.denominator >= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def test_window_length_from_sw_index():
    assert SuperlinearParams(sw_index=0).window == 0
    assert SuperlinearParams(sw_index=3).window == 15
    assert SuperlinearParams(sw_index=3, inv_search_power_int=3).window == 63
    assert SuperlinearParams(sw_index=1).window == 3


def test_stripe_distances_are_exact_powers_and_roots():
    assert [stripe_distance(i, 2) for i in range(1, 6)] == [1, 4, 9, 16, 25]
    assert stripe_distance(10**6, 3) == 10**18
    root = SuperlinearParams(search_power=0.55).stripe_root
    assert root == Fraction(20, 11)
    for i in [1, 2, 7, 100, 12345]:
        m = stripe_distance(i, root)
        assert m**11 <= i**20 < (m + 1) ** 11


def test_floor_root_is_exact_for_huge_values():
    for n in (2, 3, 5):
        for base in (10**12 + 39, 2**80 - 1):
            x = base**n
            assert floor_root(x, n) == base
            assert floor_root(x - 1, n) == base - 1
            assert floor_root(x + 1, n) == base


@pytest.mark.parametrize("factor", [2.0, 3.0, 1.5, 0.75, 2.7])
@pytest.mark.parametrize("power", [Fraction(1, 2), Fraction(2, 3), Fraction(11, 20)])
def test_ceil_scaled_power_is_exact_at_integer_boundaries(factor, power):
    # Perfect powers are where a float computation can land one above (spec section 8, item 2).
    ts = sorted({j**power.denominator for j in range(1, 400) if j**power.denominator < 10**7} | set(range(300)))
    for t in ts:
        assert ceil_scaled_power(factor, t, float(power)) == brute_ceil(factor, t, power), t


@pytest.mark.parametrize("params", [
    SuperlinearParams(),
    SuperlinearParams(sw_index=3, backward_factor=3.0, forward_factor=1.0),
    SuperlinearParams(backward_factor=1.5, span_power=2 / 3, inv_search_power_int=3),
    SuperlinearParams(search_power=0.55, span_power=0.45, backward_factor=2.7, forward_factor=0.3),
])
def test_tables_match_scalar_arithmetic(params):
    geo = span_geometry(params, 5000)
    assert geo.max_len >= 5000
    assert geo.window == params.window
    for t in list(range(0, 400)) + [j * j for j in range(20, 70)] + [geo.max_len]:
        assert int(geo.backward_len[t]) == min(ceil_scaled_power(params.backward_factor, t, params.span_power),
                                                geo.max_len + 1)
        assert int(geo.forward_len[t]) == min(ceil_scaled_power(params.forward_factor, t, params.span_power),
                                               geo.max_len + 1)
    root = params.stripe_root
    expected, i = [], params.sw_index + 1
    while stripe_distance(i, root) <= geo.max_len:
        expected.append(stripe_distance(i, root))
        i += 1
    assert geo.stripe_distance.tolist() == expected
    for q in [0, 1, 14, 15, 16, 99, 100, 4095]:
        assert int(geo.stripe_count[q]) == sum(1 for d in expected if d <= q + 1)


def test_first_stripe_lands_right_before_the_window():
    for params in (SuperlinearParams(sw_index=3), SuperlinearParams(sw_index=2, inv_search_power_int=3)):
        geo = span_geometry(params, 1000)
        assert int(geo.stripe_distance[0]) - 1 == geo.window  # anchor q + 1 - F = q - W


@settings(max_examples=30, deadline=None)
@given(q=st.integers(0, 4000), sw_index=st.integers(0, 4), bf=st.sampled_from([2.0, 2.5, 3.0]),
       ff=st.sampled_from([0.0, 1.0]))
def test_candidate_spans_and_window_cover_every_past_key(q, sw_index, bf, ff):
    """Coverage (spec 2.2): with p = sp = 1/2 and bf >= 2 the union of all candidate spans and the
    window is [0, q]."""
    params = SuperlinearParams(sw_index=sw_index, backward_factor=bf, forward_factor=ff)
    geo = span_geometry(params, q + 1)
    n = int(geo.stripe_count[q])
    anchors = torch.tensor([q + 1 - int(d) for d in geo.stripe_distance[:n]], dtype=torch.int64)
    covered = torch.zeros(q + 1, dtype=torch.bool)
    covered[max(0, q - geo.window + 1): q + 1] = True
    if n:
        lo, hi = span_bounds(anchors.view(1, 1, 1, n), torch.tensor([[q]]), torch.tensor([0]), geo)
        for a, b in zip(lo.flatten().tolist(), hi.flatten().tolist()):
            covered[a: b + 1] = True
    assert bool(covered.all())


def test_span_bounds_invariants():
    params = SuperlinearParams(sw_index=3, backward_factor=3.0, forward_factor=1.0)
    geo = span_geometry(params, 3000)
    pos = torch.arange(3000).view(1, 3000)
    n = geo.stripe_count[pos]
    # every candidate of every query
    dist = geo.stripe_distance
    anchors = pos[..., None] + 1 - dist[None, None, :]
    anchors = torch.where(torch.arange(dist.numel()) < n[..., None], anchors, -1)
    start = torch.tensor([0])
    lo, hi = span_bounds(anchors[:, None], pos, start, geo)
    valid = anchors[:, None] >= 0
    q = pos[:, None, :, None]
    assert bool((hi[valid] >= anchors[:, None][valid]).all())  # the anchor is in its span
    assert bool((lo[valid] <= anchors[:, None][valid]).all())
    assert bool((hi <= q - geo.window).expand_as(hi)[valid].all())  # spans never reach the window
    assert bool((lo >= 0).all())
    assert bool((hi[~valid] == -1).all()) and bool((lo[~valid] == 0).all())
    # forward_factor = 0 leaves the anchor as the span end
    geo0 = span_geometry(SuperlinearParams(sw_index=3), 3000)
    _, hi0 = span_bounds(anchors[:, None], pos, start, geo0)
    assert bool((hi0[valid] == anchors[:, None][valid]).all())


def test_span_length_uses_tokens_seen_after_left_padding():
    params = SuperlinearParams()
    geo = span_geometry(params, 200)
    anchor = torch.tensor([[[[100]]]])
    for pad in (0, 36):
        lo, _ = span_bounds(anchor, torch.tensor([[150]]), torch.tensor([pad]), geo)
        t = 150 + 1 - pad
        assert int(lo) == max(100 - math.ceil(2 * math.sqrt(t) - 1e-12), pad)


@pytest.mark.parametrize("kwargs, message", [
    (dict(search_power=0.5, inv_search_power_int=2), "either"),
    (dict(inv_search_power_int=7), "inv_search_power_int"),
    (dict(search_power=1.0), "search_power"),
    (dict(span_power=0.0), "span_power"),
    (dict(backward_factor=0.0), "backward_factor"),
    (dict(forward_factor=-1.0), "forward_factor"),
    (dict(topk=0), "topk"),
    (dict(sw_index=-1), "sw_index"),
])
def test_invalid_parameters_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SuperlinearParams(**kwargs)


def test_integer_search_power_is_detected_from_a_float():
    assert SuperlinearParams(search_power=1 / 3).stripe_root == 3
    assert SuperlinearParams(search_power=0.5).stripe_root == 2
    assert isinstance(SuperlinearParams(search_power=0.5123).stripe_root, float)
