"""Triton kernels against the dense-mask reference (interpreter on CPU: fp32, lengths 64-512)."""

from __future__ import annotations

import pytest
import torch

from toolkit.kernels.superlinear.naive import naive_superlinear_attention
from toolkit.kernels.superlinear.attention_spans import SuperlinearParams

from .conftest import kernels_are_interpreted, left_padding_mask, make_inputs

pytestmark = pytest.mark.triton

CASES = {
    "L64-gqa2-d16-defaults-padded": dict(batch=2, heads=4, kv_heads=2, length=64, dim=16, pads=[0, 11],
                                         params=SuperlinearParams()),
    "L128-mha-d48-readme-params": dict(batch=1, heads=2, kv_heads=2, length=128, dim=48, pads=None,
                                       params=SuperlinearParams(sw_index=3, backward_factor=3.0,
                                                                forward_factor=1.0)),
    "L256-gqa4-d32-cube-root-search": dict(batch=2, heads=4, kv_heads=1, length=256, dim=32, pads=[37, 0],
                                           params=SuperlinearParams(topk=2, inv_search_power_int=3,
                                                                    span_power=2 / 3, backward_factor=3.0,
                                                                    sw_index=1)),
    "L512-gqa2-d64-float-search-power-topk4": dict(batch=1, heads=2, kv_heads=1, length=512, dim=64, pads=None,
                                                   params=SuperlinearParams(topk=4, search_power=0.55,
                                                                            sw_index=2, forward_factor=0.5)),
    "L64-d256-max-head-dim": dict(batch=1, heads=2, kv_heads=1, length=64, dim=256, pads=[5],
                                  params=SuperlinearParams(sw_index=2, topk=2)),
}


def test_kernels_run_in_the_interpreter_on_cpu(triton_device):
    if triton_device == "cpu":
        assert kernels_are_interpreted()


@pytest.mark.parametrize("name", list(CASES))
def test_triton_prefill_matches_naive(name, triton_device):
    from toolkit.kernels.superlinear.triton.prefill import triton_superlinear_attention

    c = CASES[name]
    q1, q2, k, v = make_inputs(c["batch"], c["heads"], c["kv_heads"], c["length"], c["dim"], seed=len(name))
    mask = None if c["pads"] is None else left_padding_mask(c["batch"], c["length"], c["pads"])
    ref, ref_search = naive_superlinear_attention(q1, q2, k, v, None, mask, c["params"], return_search=True)
    dev = lambda x: None if x is None else x.to(triton_device)  # noqa: E731
    out, search = triton_superlinear_attention(dev(q1), dev(q2), dev(k), dev(v), None, dev(mask), c["params"],
                                               return_search=True)
    for label, a, b in zip(("anchor", "score", "span_start", "span_end"), ref_search, search):
        assert torch.equal(a, b.cpu().to(a.dtype)), label
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)


def test_triton_prefill_chunk_of_a_longer_cache_matches_naive(triton_device):
    from toolkit.kernels.superlinear.triton.prefill import triton_superlinear_attention

    params = SuperlinearParams(sw_index=3, backward_factor=3.0, forward_factor=1.0)
    q1, q2, k, v = make_inputs(2, 4, 2, 256, 32, seed=9)
    mask = left_padding_mask(2, 256, [0, 21])
    pos = torch.arange(100, 180)
    ref = naive_superlinear_attention(q1[:, :, pos], q2[:, :, pos], k, v, pos, mask, params)
    d = triton_device
    out = triton_superlinear_attention(q1[:, :, pos].to(d), q2[:, :, pos].to(d), k.to(d), v.to(d), pos.to(d),
                                       mask.to(d), params)
    torch.testing.assert_close(out.cpu(), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["L64-gqa2-d16-defaults-padded", "L256-gqa4-d32-cube-root-search",
                                  "L512-gqa2-d64-float-search-power-topk4"])
def test_triton_decode_matches_naive(name, triton_device):
    from toolkit.kernels.superlinear.triton.decode import triton_superlinear_decode

    c = CASES[name]
    batch = c["batch"]
    q1, q2, k, v = make_inputs(batch, c["heads"], c["kv_heads"], c["length"], c["dim"], seed=len(name))
    mask = None if c["pads"] is None else left_padding_mask(batch, c["length"], c["pads"])
    ref = naive_superlinear_attention(q1, q2, k, v, None, mask, c["params"])
    d = triton_device
    rows = torch.arange(batch)
    for t in (0, 9, c["length"] // 2, c["length"] - 1):
        pos = torch.tensor([t, max(0, t - 5)][:batch])
        out = triton_superlinear_decode(q1[rows, :, pos][:, :, None].to(d), q2[rows, :, pos][:, :, None].to(d),
                                        k.to(d), v.to(d), pos.to(d), None if mask is None else mask.to(d),
                                        c["params"])
        torch.testing.assert_close(out[:, :, 0].cpu(), ref[rows, :, pos], atol=1e-5, rtol=1e-5)


def test_triton_bf16_and_fp16_on_gpu(triton_device):
    """16-bit inputs need real tensor cores: the interpreter multiplies bf16 bit patterns."""
    if triton_device != "cuda":
        pytest.skip("16-bit dot products are not faithful under the Triton interpreter")
    from toolkit.kernels.superlinear.triton.prefill import triton_superlinear_attention

    params = SuperlinearParams(sw_index=3, backward_factor=3.0, forward_factor=1.0)
    for dtype in (torch.bfloat16, torch.float16):
        q1, q2, k, v = make_inputs(1, 8, 2, 2048, 128, seed=1, dtype=dtype)
        ref = naive_superlinear_attention(q1, q2, k, v, None, None, params)
        out = triton_superlinear_attention(q1.cuda(), q2.cuda(), k.cuda(), v.cuda(), None, None, params)
        torch.testing.assert_close(out.cpu().float(), ref.float(), atol=2e-2, rtol=2e-2)
