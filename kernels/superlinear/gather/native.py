"""A small compiled CPU kernel for the stripe search (``csrc/search.cpp``), built at first use; the
torch path otherwise.

The torch search (``search.search_rows``) gathers each query's stripe keys into a buffer (~2 GB of
row copies at 32K), multiplies, then runs several max passes for the exact top-k.  This kernel does
the same per query in one pass without copies: for each KV head it reads the stripe keys in place,
scores them against the G query heads of the group (fp32, 16-lane accumulators) and keeps the
top-k by ``attention_spans.ordered_score_key``'s order (higher score; on equal scores the farther
stripe) while it goes.  Results equal the torch path's up to fp32 summation order.

Built, cached and loaded by ``native_build`` (``cache_dir``, ``compiler`` and ``reset`` are
importable from here too).  Without a compiler (or if the build fails) the gather path keeps its
torch search and one warning line says why.  ``TOOLKIT_SUPERLINEAR_NATIVE=0`` turns the kernel off.
"""

from __future__ import annotations

import ctypes

import torch

from .native_build import LazyKernel, cache_dir, compiler, load_library, read_source, reset

__all__ = ["cache_dir", "compiler", "library", "native_search", "reset", "usable", "why_not"]

SOURCE = read_source("search.cpp")


def _build() -> ctypes.CDLL:
    # compiler() looked up here at build time: tests replace native.compiler to take it away.
    return load_library(SOURCE, "search", compiler(), "superlinear_search",
                        [ctypes.c_void_p] * 8 + [ctypes.c_int64] * 8)


_search = LazyKernel(_build, "compiled CPU search", "torch search")


def library() -> ctypes.CDLL | None:
    """The compiled search kernel, or None (turned off, or not buildable here: warned once)."""
    return _search.library()


def why_not() -> str | None:
    """Why the last build attempt failed (None if it worked or was not tried)."""
    return _search.why_not


def usable(*tensors: torch.Tensor) -> bool:
    return all(t.device.type == "cpu" for t in tensors) and library() is not None


def native_search(q_by_query: torch.Tensor, keys_flat: torch.Tensor, key_len: int, positions: torch.Tensor,
                  distance: torch.Tensor, count: torch.Tensor, mask: torch.Tensor | None, topk: int):
    """Top-k anchors and scores ``[C, H_KV, G, k]`` (anchors -1 / scores -inf = none), best first.

    q_by_query ``[C, H_KV, G, D]`` fp32; keys_flat ``[H_KV * key_len, D]`` fp32; positions ``[C]``;
    distance ``[S]`` (``F`` of each stripe, nearest first) and count (stripes per position) int64;
    mask ``[key_len]`` bool or None.
    """
    lib = library()
    count_q, kv_heads, group, dim = q_by_query.shape
    q = q_by_query.contiguous()
    k = keys_flat.contiguous()
    pos = positions.to(torch.int64).contiguous()
    dist = distance.to(torch.int64).contiguous()
    cnt = count.to(torch.int64).contiguous()
    m = None if mask is None else mask.to(torch.uint8).contiguous()
    anchors = torch.empty((count_q, kv_heads, group, topk), dtype=torch.int64)
    scores = torch.empty((count_q, kv_heads, group, topk), dtype=torch.float32)
    # callers check usable() (library() is not None) first
    lib.superlinear_search(k.data_ptr(), q.data_ptr(), pos.data_ptr(), dist.data_ptr(),  # type: ignore[union-attr]
                           cnt.data_ptr(), None if m is None else m.data_ptr(), anchors.data_ptr(),
                           scores.data_ptr(), count_q, key_len, kv_heads, group, dim, topk, cnt.numel(),
                           torch.get_num_threads())
    return anchors, scores
