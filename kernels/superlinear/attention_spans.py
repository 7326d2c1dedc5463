"""Span arithmetic of superlinear attention, in exact integers, shared by every implementation.

Where the anchors of a query lie, how wide its sliding window is, and how far each selected span
reaches backwards and forwards are all integer functions of integer positions.  They are computed
here once, on the host, with exact integer arithmetic where the exponents are rational, and stored as
lookup tables that the naive reference, the gather implementation, the Triton kernels and decode all
read.  A query therefore gets the same spans whichever path runs it, prefill or decode (the published
kernel computed ``ceil(bf * exp(sp * ln t))`` while its reference used ``ceil(bf * t**sp)``; the two
disagree at some perfect squares).

Notation (per batch row ``b``, query at absolute cache position ``q``):

* ``s``: first real key of the row (first true entry of the key mask; 0 without a mask);
  ``t = q + 1 - s``: number of real tokens the query sees.
* ``F(i) = floor(i ** (1 / p))`` with the search power ``p`` (``i ** n`` when ``p = 1 / n``).
* window: the ``W = F(sw_index + 1) - 1`` most recent positions ``[q - W + 1, q]``.
* stripes ``i = sw_index + 1, sw_index + 2, ...``: candidate anchor ``q + 1 - F(i)`` while it is >= 0.
  The first stripe lands on ``q - W``, right before the window.
* span of a selected anchor ``a``: ``[max(a - ceil(bf * t**sp), s), min(a + ceil(ff * t**sp), q - W)]``.
"""

from __future__ import annotations

import functools
import math
import threading
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import torch

# Rational exponents with a denominator up to this are handled exactly; others (e.g. 0.5123) fall
# back to float64, which is still deterministic because every implementation reads the same table.
MAX_EXACT_DENOMINATOR = 1000
# Smallest table length built; tables grow by powers of two so nearby lengths share one.
MIN_TABLE_LEN = 1024


@dataclass(frozen=True)
class SuperlinearParams:
    """Hyper-parameters of superlinear attention (defaults as the published package).

    Exactly one of ``search_power`` (float in (0, 1)) and ``inv_search_power_int`` (int n in 2..6,
    p = 1/n) may be given; with neither, p = 1/2.
    """

    sw_index: int = 0
    topk: int = 3
    backward_factor: float = 2.0
    forward_factor: float = 0.0
    span_power: float = 0.5
    search_power: float | None = None
    inv_search_power_int: int | None = None

    def __post_init__(self) -> None:
        if self.search_power is not None and self.inv_search_power_int is not None:
            raise ValueError("give either search_power or inv_search_power_int, not both")
        if self.inv_search_power_int is not None:
            n = self.inv_search_power_int
            if isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= 6:
                raise ValueError(f"inv_search_power_int must be an int in 2..6, got {n!r}")
        if self.search_power is not None and not 0.0 < float(self.search_power) < 1.0:
            raise ValueError(f"search_power must be in (0, 1), got {self.search_power!r}")
        if not 0.0 < float(self.span_power) < 1.0:
            raise ValueError(f"span_power must be in (0, 1), got {self.span_power!r}")
        if not float(self.backward_factor) > 0.0 or not math.isfinite(self.backward_factor):
            raise ValueError(f"backward_factor must be a finite number > 0, got {self.backward_factor!r}")
        if not float(self.forward_factor) >= 0.0 or not math.isfinite(self.forward_factor):
            raise ValueError(f"forward_factor must be a finite number >= 0, got {self.forward_factor!r}")
        if isinstance(self.sw_index, bool) or not isinstance(self.sw_index, int) or self.sw_index < 0:
            raise ValueError(f"sw_index must be an int >= 0, got {self.sw_index!r}")
        if isinstance(self.topk, bool) or not isinstance(self.topk, int) or not 1 <= self.topk <= 16:
            raise ValueError(f"topk must be an int in 1..16, got {self.topk!r}")

    @property
    def stripe_root(self) -> int | Fraction | float:
        """Exponent ``1/p`` of ``F(i) = floor(i ** (1/p))``: an int, an exact Fraction, or a float."""
        if self.search_power is None:
            return self.inv_search_power_int or 2
        p = float(self.search_power)
        for n in range(2, 7):
            if p == 1.0 / n:
                return n
        exact = Fraction(p).limit_denominator(MAX_EXACT_DENOMINATOR)
        if float(exact) == p:
            return 1 / exact
        return 1.0 / p

    @property
    def window(self) -> int:
        """Sliding-window length ``W`` (0 when ``sw_index == 0``)."""
        return stripe_distance(self.sw_index + 1, self.stripe_root) - 1


# --------------------------------------------------------------------------------------------------
# Exact scalar arithmetic


def floor_root(x: int, n: int) -> int:
    """Largest integer m >= 0 with m ** n <= x (x >= 0), exact for any size of x."""
    if x < 0 or n < 1:
        raise ValueError("floor_root needs x >= 0 and n >= 1")
    if x < 2 or n == 1:
        return x
    # Integer Newton iteration from above (2**ceil(bits/n) >= root) decreases to the floor root.
    m = 1 << -(-x.bit_length() // n)
    while True:
        y = ((n - 1) * m + x // m ** (n - 1)) // n
        if y >= m:
            return m
        m = y


def stripe_distance(i: int, root: int | Fraction | float) -> int:
    """``F(i) = floor(i ** root)``; the anchor of stripe i sits ``F(i) - 1`` keys behind the query."""
    if isinstance(root, int):
        return i**root
    if isinstance(root, Fraction):  # i ** (num/den) = floor(den-th root of i ** num)
        return floor_root(i**root.numerator, root.denominator)
    return int(math.floor(i**root))


def _rational(x: float) -> Fraction | None:
    exact = Fraction(x).limit_denominator(MAX_EXACT_DENOMINATOR)
    return exact if float(exact) == x else None


def ceil_scaled_power(factor: float, t: int, power: float) -> int:
    """``ceil(factor * t ** power)`` for an int t >= 0; exact when ``power`` is a small rational.

    ``factor`` is taken exactly as the binary float it is (2.0 -> 2, 1.5 -> 3/2).
    """
    if factor == 0.0 or t == 0:
        return 0
    f = Fraction(factor)
    pw = _rational(power)
    if pw is None:
        return int(math.ceil(factor * float(t) ** power))
    # m >= f * t**(u/v)  <=>  m**v >= f**v * t**u   (all quantities >= 0)
    u, v = pw.numerator, pw.denominator
    target = f**v * t**u
    m = int(math.ceil(factor * float(t) ** power))
    while m > 0 and (m - 1) ** v >= target:
        m -= 1
    while m**v < target:
        m += 1
    return m


# --------------------------------------------------------------------------------------------------
# Tables


def _stripe_distance_table(root: int | Fraction | float, limit: int) -> np.ndarray:
    """``F(1), F(2), ...`` up to and including the first value > limit (int64)."""
    out = []
    i = 1
    while True:
        d = stripe_distance(i, root)
        out.append(d)
        if d > limit:
            return np.asarray(out, dtype=np.int64)
        i += 1


def _ceil_scaled_power_table(factor: float, power: float, n: int, cap: int) -> np.ndarray:
    """``min(ceil(factor * t ** power), cap)`` for t = 0..n-1, exact as ``ceil_scaled_power``."""
    out = np.zeros(n, dtype=np.int64)
    if factor == 0.0 or n <= 1:
        return out
    t = np.arange(n, dtype=np.float64)
    est = factor * t**power
    big = est > 2.0 * cap + 2.0
    m = np.ceil(np.minimum(est, 2.0 * cap + 2.0))
    # float64 is off by far less than 1e-9 relative, so ceil(est) is exact unless est is that close
    # to an integer; those entries (e.g. perfect squares for power 1/2) are recomputed exactly.
    near = (~big) & (np.abs(est - np.round(est)) <= 1e-9 * np.maximum(est, 1.0))
    if _rational(power) is not None:
        for idx in np.flatnonzero(near):
            m[idx] = ceil_scaled_power(factor, int(idx), power)
    out[:] = np.minimum(m, cap).astype(np.int64)
    out[0] = 0
    return out


@dataclass(frozen=True, eq=False)
class SpanGeometry:
    """Lookup tables for one parameter set, valid for positions ``0 <= q < max_len``.

    * ``stripe_distance[j]``: ``F(sw_index + 1 + j)``, the candidate stripes in order (nearest first).
    * ``stripe_count[q]``: how many stripes have an anchor ``>= 0`` for a query at position q.
    * ``backward_len[t]`` / ``forward_len[t]``: span extents for a query that sees t tokens
      (t = 0..max_len), capped at ``max_len + 1``.
    """

    params: SuperlinearParams
    max_len: int
    window: int
    stripe_distance: torch.Tensor
    stripe_count: torch.Tensor
    backward_len: torch.Tensor
    forward_len: torch.Tensor

    @property
    def num_stripes(self) -> int:
        """Most stripes any query below ``max_len`` can have."""
        return int(self.stripe_distance.numel())

    def max_span_len(self, seq_len: int | None = None) -> int:
        """Longest span (keys) a query that sees at most ``seq_len`` tokens can get."""
        t = self.max_len if seq_len is None else min(seq_len, self.max_len)
        return int(self.backward_len[t]) + int(self.forward_len[t]) + 1

    def to(self, device: torch.device | str, dtype: torch.dtype = torch.int64) -> "SpanGeometry":
        return SpanGeometry(
            self.params, self.max_len, self.window,
            *(x.to(device=device, dtype=dtype) for x in
              (self.stripe_distance, self.stripe_count, self.backward_len, self.forward_len)),
        )


def _build_geometry(params: SuperlinearParams, max_len: int) -> SpanGeometry:
    root = params.stripe_root
    window = params.window
    first = params.sw_index + 1
    # Candidate stripes: i >= sw_index + 1 whose anchor q + 1 - F(i) can be >= 0 for q < max_len.
    table = _stripe_distance_table(root, max_len)  # F(1..), last entry > max_len
    valid = table[first - 1:]
    valid = valid[valid <= max_len]
    positions = np.arange(max_len, dtype=np.int64)
    count = np.searchsorted(valid, positions + 1, side="right").astype(np.int64)
    cap = max_len + 1
    backward = _ceil_scaled_power_table(params.backward_factor, params.span_power, max_len + 1, cap)
    forward = _ceil_scaled_power_table(params.forward_factor, params.span_power, max_len + 1, cap)
    return SpanGeometry(
        params, max_len, window,
        torch.from_numpy(valid.copy()), torch.from_numpy(count),
        torch.from_numpy(backward), torch.from_numpy(forward),
    )


def _table_len(n: int) -> int:
    return max(MIN_TABLE_LEN, 1 << max(0, int(n) - 1).bit_length())


@functools.lru_cache(maxsize=8)
def _host_geometry(params: SuperlinearParams, table_len: int) -> SpanGeometry:
    return _build_geometry(params, table_len)


_device_cache: dict[tuple, SpanGeometry] = {}
_device_lock = threading.Lock()


def span_geometry(
    params: SuperlinearParams, max_len: int, device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.int64,
) -> SpanGeometry:
    """Tables covering positions ``< max_len`` (at least; lengths are rounded up to a power of 2).

    Built once per (params, length bucket) on the host and cached per device and dtype.
    """
    table_len = _table_len(max_len)
    host = _host_geometry(params, table_len)
    device = torch.device(device)
    if device.type == "cpu" and dtype == torch.int64:
        return host
    key = (params, table_len, str(device), dtype)
    with _device_lock:
        geo = _device_cache.get(key)
        if geo is None:
            if len(_device_cache) > 16:
                _device_cache.clear()
            geo = _device_cache[key] = host.to(device, dtype)
    return geo


# --------------------------------------------------------------------------------------------------
# Tensor helpers (device-agnostic torch ops, no host synchronisation)


def normalize_key_mask(attention_mask: torch.Tensor | None, batch: int, key_len: int,
                       device: torch.device) -> torch.Tensor | None:
    """Bool key mask ``[B, key_len]`` (true = real token), or None when every key is real."""
    if attention_mask is None:
        return None
    if attention_mask.dim() != 2 or attention_mask.shape[0] != batch or attention_mask.shape[1] < key_len:
        raise ValueError(
            f"attention_mask must be [B, >= L_KV] = [{batch}, >= {key_len}], got {tuple(attention_mask.shape)}")
    return attention_mask[:, :key_len].to(device=device, dtype=torch.bool)


def key_start(key_mask: torch.Tensor | None, batch: int, key_len: int, device: torch.device) -> torch.Tensor:
    """First real key of each row, int64 ``[B]`` (``key_len`` for a row with no real key)."""
    if key_mask is None:
        return torch.zeros(batch, dtype=torch.int64, device=device)
    idx = torch.arange(key_len, device=device, dtype=torch.int64)
    return torch.where(key_mask, idx, key_len).amin(dim=1)


def normalize_positions(cache_position: torch.Tensor | int | None, batch: int, query_len: int,
                        key_len: int, device: torch.device) -> torch.Tensor:
    """Absolute query positions, int64 ``[B, L_Q]``.

    Accepts None (the chunk is the last ``L_Q`` positions of the cache), an int, ``[L_Q]`` (shared
    by all rows) or ``[B, L_Q]`` (per row, e.g. decode rows with different lengths).
    """
    if cache_position is None:
        pos = torch.arange(key_len - query_len, key_len, device=device, dtype=torch.int64)
        return pos.expand(batch, query_len)
    if not isinstance(cache_position, torch.Tensor):
        cache_position = torch.tensor(cache_position, dtype=torch.int64)
    pos = cache_position.to(device=device, dtype=torch.int64)
    if pos.dim() == 0:
        pos = pos.reshape(1)
    if pos.dim() == 1:
        if pos.numel() == query_len:
            pos = pos.expand(batch, query_len)
        elif query_len == 1 and pos.numel() == batch:
            pos = pos.reshape(batch, 1)
        else:
            raise ValueError(f"cache_position has {pos.numel()} entries, expected L_Q={query_len}"
                             f"{' or B=' + str(batch) if query_len == 1 else ''}")
    elif pos.dim() != 2 or pos.shape != (batch, query_len):
        raise ValueError(f"cache_position must be [L_Q] or [B, L_Q], got {tuple(pos.shape)}")
    return pos


def check_positions(positions: torch.Tensor, key_len: int) -> None:
    """Raise if a query position is outside the cache (reads the tensor: host synchronisation)."""
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= key_len):
        raise ValueError(f"cache_position must lie in [0, L_KV={key_len}); got "
                         f"[{int(positions.min())}, {int(positions.max())}]")


def span_bounds(anchor: torch.Tensor, positions: torch.Tensor, start: torch.Tensor,
                geometry: SpanGeometry) -> tuple[torch.Tensor, torch.Tensor]:
    """Key range ``[span_start, span_end]`` of each selected anchor (int64, empty = ``(0, -1)``).

    anchor: ``[B, H, L_Q, k]`` (-1 = none); positions: ``[B, L_Q]``; start: ``[B]``.
    """
    pos = positions[:, None, :, None]
    seen = (positions - start[:, None] + 1).clamp(min=0, max=geometry.max_len)[:, None, :, None]
    back = geometry.backward_len.to(anchor.device)[seen]
    fwd = geometry.forward_len.to(anchor.device)[seen]
    lo = torch.maximum(anchor - back, start[:, None, None, None])
    hi = torch.minimum(anchor + fwd, pos - geometry.window)
    valid = anchor >= 0
    lo = torch.where(valid, lo, 0)
    hi = torch.where(valid, hi, -1)
    return lo, hi


def ordered_score_key(scores: torch.Tensor, stripe_index: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """int64 sort key that orders candidates exactly as every implementation's top-k does.

    Higher score wins; on equal scores the farther stripe (larger stripe index, smaller anchor)
    wins, as in the published kernel.  Invalid candidates get the minimum key.  ``-0.0`` and
    ``+0.0`` compare equal.
    """
    bits = (scores.float() + 0.0).view(torch.int32)  # + 0.0 turns -0.0 into +0.0
    ordered = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(torch.int64)
    key = ordered * (1 << 32) + stripe_index.to(torch.int64)
    return torch.where(valid, key, torch.iinfo(torch.int64).min)
