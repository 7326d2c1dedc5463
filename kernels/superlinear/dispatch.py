"""The public entry points of superlinear attention, one per operation, dispatching by device.

``impl`` picks the implementation: ``"auto"`` (Triton for CUDA tensors when Triton is installed,
else the gather implementation), ``"triton"``, ``"gather"`` (efficient PyTorch, any device) or
``"naive"`` (dense-mask reference, CPU, tests only).

Shapes: ``q1`` (search queries) and ``q2`` (attention queries) ``[B, H_Q, L_Q, D]`` (they may be the
same tensor); ``k``, ``v`` ``[B, H_KV, L_KV, D]`` with ``H_Q % H_KV == 0`` (GQA: query head h reads
KV head ``h // (H_Q // H_KV)``); ``attention_mask`` ``[B, >= L_KV]`` bool/int key mask (true = real
token; left padding); D <= 256; fp32/bf16/fp16 (fp32 accumulation).  Keys after a query's position
are never read, so K/V may be a preallocated cache longer than the filled part.
"""

from __future__ import annotations

import importlib
import os
from typing import NamedTuple

import torch

from .attention_spans import SuperlinearParams

IMPLEMENTATIONS = ("auto", "triton", "gather", "naive")
MAX_HEAD_DIM = 256


class SpanSearch(NamedTuple):
    """Search result per (batch, query head, query, span), best span first.

    anchor: key position (-1: fewer candidates than topk); score: raw ``<q1, k[anchor]>`` in fp32
    (-inf: none); span_start/span_end: the span's key range, inclusive (``0, -1`` when empty).
    """

    anchor: torch.Tensor
    score: torch.Tensor
    span_start: torch.Tensor
    span_end: torch.Tensor


def triton_available() -> bool:
    try:
        importlib.import_module("triton")
    except Exception:
        return False
    return True


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def resolve_impl(impl: str | None, device: torch.device) -> str:
    """The implementation ``impl`` stands for on ``device`` (``"auto"`` resolved)."""
    impl = impl or "auto"
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"impl must be one of {IMPLEMENTATIONS}, got {impl!r}")
    if impl == "auto":
        return "triton" if device.type == "cuda" and triton_available() else "gather"
    if impl == "triton":
        if not triton_available():
            raise RuntimeError("impl='triton' needs the triton package; use impl='gather'")
        if device.type != "cuda" and not _interpreting():
            raise RuntimeError("impl='triton' needs CUDA tensors (or TRITON_INTERPRET=1 on CPU)")
    return impl


def make_params(*, sw_index: int = 0, topk: int = 3, backward_factor: float = 2.0,
                forward_factor: float = 0.0, span_power: float = 0.5, search_power: float | None = None,
                inv_search_power_int: int | None = None) -> SuperlinearParams:
    return SuperlinearParams(
        sw_index=int(sw_index), topk=int(topk), backward_factor=float(backward_factor),
        forward_factor=float(forward_factor), span_power=float(span_power),
        search_power=None if search_power is None else float(search_power),
        inv_search_power_int=None if inv_search_power_int is None else int(inv_search_power_int),
    )


def _check(q1, q2, k, v, query_len_one: bool = False) -> None:
    if q1.dim() != 4 or q2.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError("q1, q2, k, v must be 4-D: [B, H, L, D]")
    if q1.shape != q2.shape:
        raise ValueError(f"q1 {tuple(q1.shape)} and q2 {tuple(q2.shape)} must have the same shape")
    if k.shape != v.shape:
        raise ValueError(f"k {tuple(k.shape)} and v {tuple(v.shape)} must have the same shape")
    b, h, lq, d = q2.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k/v {tuple(k.shape)} do not match q {tuple(q2.shape)} in batch or head dim")
    if h % k.shape[1]:
        raise ValueError(f"H_Q={h} must be a multiple of H_KV={k.shape[1]}")
    if d > MAX_HEAD_DIM:
        raise ValueError(f"head dim {d} > {MAX_HEAD_DIM} is not supported")
    if query_len_one and lq != 1:
        raise ValueError(f"decode takes one query per row ([B, H, 1, D]), got L_Q={lq}")
    if q2.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        raise ValueError(f"dtype {q2.dtype} not supported (fp32, bf16, fp16)")


def superlinear_attention(
    q1: torch.Tensor, q2: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    cache_position: torch.Tensor | None = None, attention_mask: torch.Tensor | None = None, *,
    sw_index: int = 0, topk: int = 3, backward_factor: float = 2.0, forward_factor: float = 0.0,
    span_power: float = 0.5, search_power: float | None = None, inv_search_power_int: int | None = None,
    scale: float | None = None, impl: str | None = "auto",
) -> torch.Tensor:
    """Superlinear attention for a prefill or a prefill chunk: ``[B, H_Q, L_Q, D]`` in q2's dtype.

    ``cache_position``: absolute positions of the ``L_Q`` queries, ``[L_Q]`` or ``[B, L_Q]``
    (default: the last ``L_Q`` positions of the cache, i.e. ``L_KV - L_Q + arange(L_Q)``); K/V hold
    the cache up to at least the last position.  Running a prefill in chunks gives the same rows as
    one shot.  ``scale`` defaults to ``1/sqrt(D)``.
    """
    _check(q1, q2, k, v)
    params = make_params(sw_index=sw_index, topk=topk, backward_factor=backward_factor,
                         forward_factor=forward_factor, span_power=span_power, search_power=search_power,
                         inv_search_power_int=inv_search_power_int)
    which = resolve_impl(impl, q2.device)
    if which == "naive":
        from .naive import naive_superlinear_attention
        return naive_superlinear_attention(q1, q2, k, v, cache_position, attention_mask, params, scale).to(q2.device)
    if which == "gather":
        from .gather import gather_superlinear_attention
        return gather_superlinear_attention(q1, q2, k, v, cache_position, attention_mask, params, scale)
    from .triton.prefill import triton_superlinear_attention
    return triton_superlinear_attention(q1, q2, k, v, cache_position, attention_mask, params, scale)


def superlinear_decode(
    q1: torch.Tensor, q2: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    cache_position: torch.Tensor | int, attention_mask: torch.Tensor | None = None, *,
    sw_index: int = 0, topk: int = 3, backward_factor: float = 2.0, forward_factor: float = 0.0,
    span_power: float = 0.5, search_power: float | None = None, inv_search_power_int: int | None = None,
    scale: float | None = None, impl: str | None = "auto",
) -> torch.Tensor:
    """One decode step for a batch of single queries ``[B, H_Q, 1, D]``, each at its own position.

    ``cache_position``: ``[B]`` positions (row b attends keys ``<= cache_position[b]``), or one
    shared position.  Equals row ``cache_position`` of a prefill over the same cache.  The Triton
    path has static shapes and no host synchronisation (CUDA-graph friendly for a fixed cache size).
    """
    _check(q1, q2, k, v, query_len_one=True)
    params = make_params(sw_index=sw_index, topk=topk, backward_factor=backward_factor,
                         forward_factor=forward_factor, span_power=span_power, search_power=search_power,
                         inv_search_power_int=inv_search_power_int)
    which = resolve_impl(impl, q2.device)
    if which == "naive":
        from .naive import naive_superlinear_attention
        batch = q2.shape[0]
        pos = torch.as_tensor(cache_position).reshape(-1).expand(batch).reshape(batch, 1)
        return naive_superlinear_attention(q1, q2, k, v, pos, attention_mask, params, scale).to(q2.device)
    if which == "gather":
        from .gather import gather_superlinear_decode
        return gather_superlinear_decode(q1, q2, k, v, cache_position, attention_mask, params, scale)
    from .triton.decode import triton_superlinear_decode
    return triton_superlinear_decode(q1, q2, k, v, cache_position, attention_mask, params, scale)


def superlinear_search(
    q1: torch.Tensor, k: torch.Tensor, cache_position: torch.Tensor | None = None,
    attention_mask: torch.Tensor | None = None, *, sw_index: int = 0, topk: int = 3,
    backward_factor: float = 2.0, forward_factor: float = 0.0, span_power: float = 0.5,
    search_power: float | None = None, inv_search_power_int: int | None = None, impl: str | None = "auto",
) -> SpanSearch:
    """The spans each query selects (anchors, scores, span bounds), ``[B, H_Q, L_Q, topk]`` each."""
    params = make_params(sw_index=sw_index, topk=topk, backward_factor=backward_factor,
                         forward_factor=forward_factor, span_power=span_power, search_power=search_power,
                         inv_search_power_int=inv_search_power_int)
    which = resolve_impl(impl, q1.device)
    if which == "naive":
        from .attention_spans import (
            key_start,
            normalize_key_mask,
            normalize_positions,
            span_bounds,
            span_geometry,
        )
        from .naive import naive_search
        batch, _, query_len, _ = q1.shape
        key_len = k.shape[2]
        cpu = torch.device("cpu")
        pos = normalize_positions(cache_position, batch, query_len, key_len, cpu)
        mask = normalize_key_mask(attention_mask, batch, key_len, cpu)
        anchor, score = naive_search(q1, k, pos, mask, params)
        lo, hi = span_bounds(anchor, pos, key_start(mask, batch, key_len, cpu), span_geometry(params, key_len))
        return SpanSearch(anchor, score, lo, hi)
    if which == "gather":
        from .gather import gather_superlinear_search
        return SpanSearch(*gather_superlinear_search(q1, k, cache_position, attention_mask, params))
    from .triton.prefill import triton_superlinear_search
    return SpanSearch(*triton_superlinear_search(q1, k, cache_position, attention_mask, params))
