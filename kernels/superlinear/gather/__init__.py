"""Efficient PyTorch superlinear attention: gathers only the keys each query needs.

The CPU implementation and the fallback on any device, laid out like the Triton kernels: ``search``
(stripe search and exact top-k), ``partials`` (softmax partials of the window and the spans),
``merge`` (log-sum-exp merge and score gate), ``prefill`` and ``decode`` (the entry points), and
``workspace`` (sizes, scratch buffers, input preparation).  Work per query is O(sqrt t) (stripes,
spans) plus the window.  Where a C++ compiler is, ``native`` (stripe search) and ``native_spans``
(span attention) run compiled kernels instead (C++ in ``csrc/``, built at first use by
``native_build``).
"""

from .decode import gather_superlinear_decode
from .prefill import gather_superlinear_attention, gather_superlinear_search

__all__ = ["gather_superlinear_attention", "gather_superlinear_decode", "gather_superlinear_search"]
