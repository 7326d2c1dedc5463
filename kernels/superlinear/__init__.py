"""Superlinear attention: O(L^1.5) prefill and O(sqrt t) decode by span search.

Public entry points (``api``): ``superlinear_attention`` (prefill and prefill chunks),
``superlinear_decode`` (one query per row, per-row positions), ``superlinear_search`` (the spans
each query selects).  ``spans`` holds the exact-integer span arithmetic all implementations share.
Implementations: ``naive`` (dense masks, tests only), ``gather`` (PyTorch, CPU and fallback),
``triton`` (GPU kernels).
"""

from .api import (
    IMPLEMENTATIONS,
    SpanSearch,
    resolve_impl,
    superlinear_attention,
    superlinear_decode,
    superlinear_search,
)
from .spans import SpanGeometry, SuperlinearParams, span_geometry

__all__ = [
    "IMPLEMENTATIONS",
    "SpanGeometry",
    "SpanSearch",
    "SuperlinearParams",
    "resolve_impl",
    "span_geometry",
    "superlinear_attention",
    "superlinear_decode",
    "superlinear_search",
]
