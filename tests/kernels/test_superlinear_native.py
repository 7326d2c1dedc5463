"""The compiled CPU search (``gather/native.py``) against the torch search and the naive reference,
and its fallback when no compiler is there.

Inputs on the exact grid (``conftest.exact_scores_tensor``): dot products are exact in any summation
order, so both searches must pick the same anchors, ties included (many exact ties on this grid).
"""

from __future__ import annotations


import pytest
import torch
from hypothesis import HealthCheck, given, settings

from toolkit.kernels.superlinear.attention_spans import SuperlinearParams
from toolkit.kernels.superlinear.gather import gather_superlinear_attention, gather_superlinear_search, native
from toolkit.kernels.superlinear.naive import naive_superlinear_attention

from .conftest import left_padding_mask, make_inputs, requires_compiler, two_calls_and_warnings
from .test_superlinear_gather import case_strategy, run_both

def both_searches(monkeypatch, q1, k, positions, mask, params):
    monkeypatch.setenv("TOOLKIT_SUPERLINEAR_NATIVE", "1")
    fast = gather_superlinear_search(q1, k, positions, mask, params)
    monkeypatch.setenv("TOOLKIT_SUPERLINEAR_NATIVE", "0")
    slow = gather_superlinear_search(q1, k, positions, mask, params)
    monkeypatch.setenv("TOOLKIT_SUPERLINEAR_NATIVE", "1")
    return fast, slow


@requires_compiler
@pytest.mark.parametrize("batch,heads,kv_heads,length,dim,pads,params", [
    (1, 8, 2, 1500, 64, None, SuperlinearParams()),
    (2, 4, 1, 700, 8, [0, 77], SuperlinearParams(sw_index=2, topk=4)),
    (1, 3, 3, 400, 24, None, SuperlinearParams(sw_index=1, topk=2, inv_search_power_int=3)),
    (2, 6, 2, 900, 40, [13, 0], SuperlinearParams(topk=3, search_power=0.55, backward_factor=3.0)),
    (1, 10, 2, 300, 128, None, SuperlinearParams(sw_index=4, topk=1)),
    (1, 2, 1, 40, 16, [3], SuperlinearParams(sw_index=3, topk=4)),  # rows with fewer stripes than k
])
def test_native_search_equals_torch_search(monkeypatch, built_native, batch, heads, kv_heads, length, dim, pads,
                                           params):
    q1, _, k, _ = make_inputs(batch, heads, kv_heads, length, dim, seed=length + dim)
    mask = None if pads is None else left_padding_mask(batch, length, pads)
    positions = torch.arange(length)
    fast, slow = both_searches(monkeypatch, q1, k, positions, mask, params)
    assert native.library() is not None, native.why_not()
    for name, a, b in zip(("anchor", "score", "span_start", "span_end"), fast, slow):
        assert torch.equal(a, b), name
    assert bool((fast[0] >= 0).any())


@requires_compiler
def test_native_search_on_a_chunk_of_a_longer_cache_with_threads(monkeypatch, built_native):
    """Queries at positions 600..1399 of a 1700-key cache (keys after a query never read), the
    kernel split over 2 threads (interleaved query slices)."""
    q1, _, k, _ = make_inputs(1, 8, 2, 1700, 32, seed=5)
    q1 = q1[:, :, 600:1400]
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        fast, slow = both_searches(monkeypatch, q1, k, torch.arange(600, 1400), None, SuperlinearParams())
    finally:
        torch.set_num_threads(saved)
    for a, b in zip(fast, slow):
        assert torch.equal(a, b)


@requires_compiler
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=case_strategy())
def test_native_gather_matches_naive(case):
    """The whole gather path with the compiled search (the default where a compiler is) equals the
    naive reference: search results exactly, outputs to 1e-5."""
    native.reset()
    assert native.library() is not None
    ref, ref_search, out, search = run_both(case)
    for name, a, b in zip(("anchor", "score", "span_start", "span_end"), ref_search, search):
        assert torch.equal(a, b.to(a.dtype)), name
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_torch_search_path_matches_naive(monkeypatch):
    """With the kernel turned off the torch search runs (the path of a machine without a compiler)."""
    monkeypatch.setenv("TOOLKIT_SUPERLINEAR_NATIVE", "0")
    assert native.library() is None
    q1, q2, k, v = make_inputs(2, 8, 2, 800, 32, seed=9)
    mask = left_padding_mask(2, 800, [0, 100])
    params = SuperlinearParams(sw_index=2)
    ref, ref_search = naive_superlinear_attention(q1, q2, k, v, None, mask, params, return_search=True)
    out, search = gather_superlinear_attention(q1, q2, k, v, None, mask, params, return_search=True)
    for a, b in zip(ref_search, search):
        assert torch.equal(a, b.to(a.dtype))
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_no_compiler_falls_back_with_one_warning(monkeypatch, fresh_native):
    """No compiler: one RuntimeWarning line naming why, no traceback, and the torch search's results
    (equal to naive) on every later call without a second warning."""
    monkeypatch.setattr(native, "compiler", lambda: None)
    ref, out, again, messages = two_calls_and_warnings(seed=2, dim=16)
    assert len(messages) == 1, messages
    assert "no C++ compiler" in messages[0] and "\n" not in messages[0]
    assert native.library() is None
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(again, ref, atol=1e-5, rtol=1e-5)
    assert not list(fresh_native.glob("superlinear-native/*.so"))


def test_failed_build_falls_back(monkeypatch, fresh_native):
    """A compiler that fails (here: not a compiler at all) gives the same one-line fallback."""
    monkeypatch.setattr(native, "compiler", lambda: "/bin/false")
    with pytest.warns(RuntimeWarning, match="compiled CPU search unavailable"):
        assert native.library() is None
    assert native.why_not() and "\n" not in native.why_not()


@requires_compiler
def test_build_is_cached_in_the_user_cache_dir(fresh_native):
    lib = native.library()
    assert lib is not None, native.why_not()
    built = list(fresh_native.glob("superlinear-native/search-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    native.reset()
    assert native.library() is not None
    assert built[0].stat().st_mtime_ns == stamp  # loaded, not rebuilt
    assert not [p for p in (fresh_native / "superlinear-native").iterdir() if p.is_dir()]  # no build dir left
