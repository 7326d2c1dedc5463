"""The span attention of a prefill chunk as a compiled CPU kernel (``csrc/spans.cpp``), built at first
use; torch otherwise.

``partials.span_partials`` tiles the (query, span) pairs by key-block footprint and runs PyTorch's
fused flash kernel with a band mask: the tiles gather their keys, values, queries and mask (~0.5 s
of copies at 32K) and compute 1/0.70 of the FLOPs the spans need.  This kernel reads the key and
value rows in place (keys once transposed into blocks of 16, ``[D, 16]`` each, and values padded
to whole blocks, per call) and computes each pair over its own span only:

* pairs are taken in (KV head, span start) order and in groups of ``GROUP_SIZE`` (32); a group
  walks the union of its spans in blocks of 16 keys, so each block is read from L2 once per group
  and stays in L1 while the pairs that meet it take their step;
* the scores of up to 6 of those pairs against the block are one register-tiled product (per
  dimension: two 8-key loads, one broadcast and two FMAs per query; 12 accumulators);
* per pair, keys outside its span or masked get weight 0; online softmax (block max, rescale, a
  vectorised Cephes-style exp, ~1 ulp); PV for two pairs at once (each value row load feeds both).

Results equal the torch path's up to fp32 rounding (~1e-6).  A span without a real key gives
lse -inf and output 0 (``partials``' definition of an empty set).  Built by ``native_build``
(same compiler, flags and cache dir as the compiled search) and only where the search kernel built;
if this build alone fails, one warning line and the torch tiles; ``TOOLKIT_SUPERLINEAR_NATIVE=0``
turns both kernels off.
"""

from __future__ import annotations

import ctypes

import torch

from . import native
from .native_build import LazyKernel, load_library, read_source

SOURCE = read_source("spans.cpp")
GROUP_SIZE = 32  # pairs that walk the key blocks together (each block read once from L2 per group)


def _build() -> ctypes.CDLL:
    argtypes = [ctypes.c_void_p] * 9 + [ctypes.c_int64] * 5 + [ctypes.c_float, ctypes.c_int64, ctypes.c_int64]
    return load_library(SOURCE, "spans", native.compiler(), "superlinear_span_partials", argtypes)


# Only where the search kernel built (no compiler: the search's warning already said so).
_spans = LazyKernel(_build, "compiled CPU span attention", "torch span tiles", requires=native.library)


def library() -> ctypes.CDLL | None:
    """The compiled kernel, or None (turned off, or not buildable here: warned once)."""
    return _spans.library()


def why_not() -> str | None:
    """Why the last build attempt failed (None if it worked or was not tried)."""
    return _spans.why_not


def usable(q2_rows: torch.Tensor) -> bool:
    return (q2_rows.device.type == "cpu" and q2_rows.dtype == torch.float32 and q2_rows.shape[-1] % 8 == 0
            and library() is not None)


def key_layout(k_flat: torch.Tensor, v_flat: torch.Tensor, key_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's key and value layouts: keys ``[H_KV, blocks, D, 16]`` (each block of 16 transposed)
    and values ``[H_KV, blocks * 16, D]`` (zero-padded, so a block's 16 value rows are always readable).
    One copy of a batch row's keys: ``partials`` keeps it on the ``KeyRow`` for every chunk."""
    dim = k_flat.shape[-1]
    kv_heads = k_flat.shape[0] // key_len
    blocks = -(-key_len // 16)
    k = torch.nn.functional.pad(k_flat.view(kv_heads, key_len, dim), (0, 0, 0, blocks * 16 - key_len))
    k = k.view(kv_heads, blocks, 16, dim).transpose(-1, -2).contiguous()
    v = torch.nn.functional.pad(v_flat.view(kv_heads, key_len, dim), (0, 0, 0, blocks * 16 - key_len))
    return k, v.contiguous()


def span_partials_native(q2_rows: torch.Tensor, k_flat: torch.Tensor, v_flat: torch.Tensor, key_len: int,
                         key_mask: torch.Tensor | None, span_lo: torch.Tensor, span_hi: torch.Tensor,
                         scale: float, layout: tuple[torch.Tensor, torch.Tensor] | None = None):
    """``partials.span_partials``'s result (lse ``[H_KV, G, C, k]``, out + ``D``) from the kernel.

    q2_rows ``[H_KV, G, C, D]`` fp32; k_flat/v_flat ``[H_KV * key_len, D]`` fp32; key_mask ``[key_len]``
    bool or None; span_lo/hi ``[H_KV, G, C, k]`` (hi < lo: no span, lse -inf and out 0); layout:
    ``key_layout(k_flat, v_flat, key_len)`` if the caller has it already.
    """
    lib = library()
    kv_heads, group, count, dim = q2_rows.shape
    topk = span_lo.shape[-1]
    pairs = kv_heads * group * count * topk
    q = q2_rows.contiguous()
    k, v = key_layout(k_flat, v_flat, key_len) if layout is None else layout
    lo = span_lo.reshape(-1).to(torch.int64).contiguous()
    hi = span_hi.reshape(-1).to(torch.int64).contiguous()
    # (KV head, span start) order: consecutive pairs read nearly the same key rows.
    head = torch.arange(pairs, dtype=torch.int64) // (group * count * topk)
    order = torch.argsort(head * (key_len + 1) + lo.clamp(0, key_len)).contiguous()
    m = None if key_mask is None else key_mask.to(torch.uint8).contiguous()
    lse = torch.empty(pairs, dtype=torch.float32)
    out = torch.empty((pairs, dim), dtype=torch.float32)
    # callers check usable() (library() is not None) first
    rc = lib.superlinear_span_partials(q.data_ptr(), k.data_ptr(), v.data_ptr(), lo.data_ptr(), hi.data_ptr(),  # type: ignore[union-attr]
                                       order.data_ptr(), None if m is None else m.data_ptr(), lse.data_ptr(),
                                       out.data_ptr(), pairs, key_len, group * count * topk, topk, dim,
                                       float(scale), GROUP_SIZE, torch.get_num_threads())
    if rc != 0:
        raise RuntimeError(f"compiled span attention refused dim {dim} (needs a multiple of 8)")
    shape = (kv_heads, group, count, topk)
    return lse.view(shape), out.view(*shape, dim)
