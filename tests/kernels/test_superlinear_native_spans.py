"""The compiled span attention (``gather/native_spans.py``) against the torch span tiles
(``partials.span_partials`` with the kernel off), the naive reference, and its fallbacks.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from toolkit.kernels.superlinear.attention_spans import SuperlinearParams
from toolkit.kernels.superlinear.gather import gather_superlinear_attention, native, native_spans, partials
from toolkit.kernels.superlinear.gather.workspace import KeyRow, Workspace
from toolkit.kernels.superlinear.naive import naive_superlinear_attention

from .conftest import left_padding_mask, make_inputs, requires_compiler, two_calls_and_warnings

def random_spans(kv_heads, group, count, topk, key_len, longest, seed):
    """Ragged spans [lo, hi] inside the keys, about 1 in 8 empty (hi < lo)."""
    g = torch.Generator().manual_seed(seed)
    lo = torch.randint(0, key_len, (kv_heads, group, count, topk), generator=g)
    length = torch.randint(-longest // 8, longest, (kv_heads, group, count, topk), generator=g)
    hi = (lo + length).clamp(max=key_len - 1)
    return lo, hi


def both_partials(monkeypatch, q2_rows, keys, lo, hi, scale):
    monkeypatch.setenv("TOOLKIT_SUPERLINEAR_NATIVE", "0")
    slow = [t.clone() for t in partials.span_partials(q2_rows, keys, lo, hi, scale, Workspace(torch.device("cpu")))]
    monkeypatch.setenv("TOOLKIT_SUPERLINEAR_NATIVE", "1")
    assert native_spans.usable(q2_rows), native_spans.why_not() or native.why_not()
    fast = partials.span_partials(q2_rows, keys, lo, hi, scale, Workspace(torch.device("cpu")))
    return fast, slow


@requires_compiler
@pytest.mark.parametrize("kv_heads,group,count,dim,key_len,topk,longest,masked", [
    (2, 4, 300, 64, 1000, 3, 300, False),  # GQA, the benchmark's head dim
    (3, 1, 200, 32, 500, 2, 120, False),  # MHA
    (1, 2, 150, 128, 700, 3, 400, False),
    (2, 3, 100, 40, 333, 4, 90, False),  # a head dim that is no multiple of 32 (generic loops)
    (2, 2, 250, 64, 900, 3, 200, True),  # masked keys inside spans
    (1, 4, 64, 32, 37, 2, 37, False),  # spans reaching the last key of a length that is no multiple of 16
])
def test_native_span_partials_equal_torch(monkeypatch, built_native, kv_heads, group, count, dim, key_len, topk,
                                          longest, masked):
    torch.manual_seed(key_len + dim)
    q = torch.randn(kv_heads, group, count, dim)
    k, v = torch.randn(kv_heads, key_len, dim), torch.randn(kv_heads, key_len, dim)
    mask = (torch.rand(key_len) > 0.25) if masked else None
    keys = KeyRow.build(k, v, mask)
    lo, hi = random_spans(kv_heads, group, count, topk, key_len, longest, seed=count)
    if mask is not None:  # the torch tiles define no result for a span without a real key: keep one
        lo_c, hi_c = lo.clamp(0, key_len - 1), hi.clamp(0, key_len - 1)
        mask[lo_c.reshape(-1)] = True
        keys = KeyRow.build(k, v, mask)
        assert bool(mask[hi_c.reshape(-1)].any())
    (lse, out), (lse_t, out_t) = both_partials(monkeypatch, q, keys, lo, hi, dim ** -0.5)
    empty = hi < lo
    assert bool(empty.any()) and bool((~empty).any())
    assert bool((lse[empty] == float("-inf")).all()) and not bool(out[empty].any())
    torch.testing.assert_close(lse[~empty], lse_t[~empty], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out, out_t, atol=1e-5, rtol=1e-5)


@requires_compiler
def test_native_span_without_a_real_key_is_empty(built_native):
    """A span whose keys are all masked is an empty set: lse -inf and output 0, as ``partials`` defines."""
    q = torch.randn(1, 1, 2, 32)
    k, v = torch.randn(1, 50, 32), torch.randn(1, 50, 32)
    mask = torch.ones(50, dtype=torch.bool)
    mask[10:30] = False
    lo = torch.tensor([[[[12], [5]]]])
    hi = torch.tensor([[[[25], [40]]]])
    lse, out = native_spans.span_partials_native(q, k.view(50, 32), v.view(50, 32), 50, mask, lo, hi, 0.2)
    assert lse[0, 0, 0, 0] == float("-inf") and not bool(out[0, 0, 0].any())
    keep = torch.cat([torch.arange(5, 10), torch.arange(30, 41)])
    p = torch.softmax(0.2 * (k[0, keep] @ q[0, 0, 1]), 0)
    torch.testing.assert_close(out[0, 0, 1, 0], p @ v[0, keep], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(lse[0, 0, 1, 0], torch.logsumexp(0.2 * (k[0, keep] @ q[0, 0, 1]), 0),
                               atol=1e-5, rtol=1e-5)


@requires_compiler
def test_native_span_partials_with_threads(monkeypatch, built_native):
    """Enough pairs (>= 4096) for the kernel to split the sorted pairs over 2 threads: same result."""
    torch.manual_seed(3)
    q = torch.randn(2, 4, 700, 64)
    k, v = torch.randn(2, 3000, 64), torch.randn(2, 3000, 64)
    lo, hi = random_spans(2, 4, 700, 3, 3000, 400, seed=4)
    args = (q, k.view(-1, 64), v.view(-1, 64), 3000, None, lo, hi, 0.125)
    saved = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = native_spans.span_partials_native(*args)
        torch.set_num_threads(2)
        two = native_spans.span_partials_native(*args)
    finally:
        torch.set_num_threads(saved)
    torch.testing.assert_close(two[0], one[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(two[1], one[1], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("native_on", ["1", "0"])
@pytest.mark.parametrize("heads,kv_heads,dim,pads", [(8, 2, 64, [0, 120]), (4, 4, 32, None), (4, 2, 128, [40, 0])])
def test_gather_with_native_spans_matches_naive(monkeypatch, native_on, heads, kv_heads, dim, pads):
    monkeypatch.setenv("TOOLKIT_SUPERLINEAR_NATIVE", native_on)
    if native_on == "1" and native.compiler() is None:
        pytest.skip("no C++ compiler on this machine")
    assert (native_spans.library() is not None) == (native_on == "1")
    length = 1100
    q1, q2, k, v = make_inputs(2, heads, kv_heads, length, dim, seed=dim + heads)
    mask = None if pads is None else left_padding_mask(2, length, pads)
    params = SuperlinearParams(sw_index=1, topk=3)
    ref = naive_superlinear_attention(q1, q2, k, v, None, mask, params)
    out = gather_superlinear_attention(q1, q2, k, v, None, mask, params)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    # In chunks: the kernel's key layout is made once per batch row and read by every chunk.
    chunked = gather_superlinear_attention(q1, q2, k, v, None, mask, params, query_chunk=300)
    torch.testing.assert_close(chunked, ref, atol=1e-5, rtol=1e-5)


def test_failed_span_build_falls_back_with_one_warning(monkeypatch, fresh_native):
    """The span kernel alone failing to build (here: broken source) warns once, in one line, and the
    torch span tiles give the naive result."""
    if native.compiler() is None:
        pytest.skip("no C++ compiler on this machine")
    monkeypatch.setattr(native_spans, "SOURCE", "#error broken on purpose\n")
    ref, out, again, messages = two_calls_and_warnings(seed=6, dim=32)
    assert len(messages) == 1 and "compiled CPU span attention unavailable" in messages[0], messages
    assert "\n" not in messages[0]
    assert native.library() is not None and native_spans.library() is None
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(again, ref, atol=1e-5, rtol=1e-5)


def test_no_compiler_no_span_kernel(monkeypatch, fresh_native):
    """Without a compiler neither kernel loads, and only the search's warning line is given."""
    monkeypatch.setattr(native, "compiler", lambda: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert native_spans.library() is None
    assert len([w for w in caught if issubclass(w.category, RuntimeWarning)]) == 1
