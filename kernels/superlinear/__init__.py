"""Superlinear attention: O(L^1.5) prefill and O(sqrt t) decode by span search.

Public entry points (``dispatch``): ``superlinear_attention`` (prefill and prefill chunks),
``superlinear_decode`` (one query per row, per-row positions), ``superlinear_search`` (the spans
each query selects).  ``attention_spans`` holds the exact-integer span arithmetic all implementations share.
Implementations: ``naive`` (dense masks, tests only), ``gather`` (PyTorch, CPU and fallback),
``triton`` (GPU kernels).

Over an engine's paged KV cache (``paged``; ``paged_kv``, ``paged_layout`` and ``paged_cpu`` behind it):
``PagedKV`` (blocks + block table, or a token pool),
``superlinear_attention_paged`` (ragged serving batches) and ``superlinear_decode_paged`` (one
query per request; the Triton path is CUDA-graph capturable).
"""

from .dispatch import (
    IMPLEMENTATIONS,
    SpanSearch,
    resolve_impl,
    superlinear_attention,
    superlinear_decode,
    superlinear_search,
)
from .attention_spans import SpanGeometry, SuperlinearParams, span_geometry
from .paged import PagedKV, superlinear_attention_paged, superlinear_decode_paged

__all__ = [
    "IMPLEMENTATIONS",
    "PagedKV",
    "SpanGeometry",
    "SpanSearch",
    "SuperlinearParams",
    "resolve_impl",
    "span_geometry",
    "superlinear_attention",
    "superlinear_attention_paged",
    "superlinear_decode",
    "superlinear_decode_paged",
    "superlinear_search",
]
