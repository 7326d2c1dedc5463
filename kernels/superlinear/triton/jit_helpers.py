"""Helpers shared by the Triton kernels: launcher arguments and ``@triton.jit`` building blocks
(online softmax, top-k sets, decode ranges, merge and gate) used by the contiguous and paged kernels."""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


def interpreting() -> bool:
    """Whether launches run in Triton's CPU interpreter (bigger blocks there: fewer Python steps)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def block_dim(dim: int) -> int:
    """Register width for a head dim: next power of two, at least 16 (``tl.dot`` minimum)."""
    return max(16, triton.next_power_of_2(dim))


def dot_precision(dtype: torch.dtype) -> str:
    """fp32 inputs use exact fp32 products (the default TF32 would cost ~1e-3); 16-bit run native."""
    return "ieee" if dtype == torch.float32 else "tf32"


def key_mask_arg(key_mask: torch.Tensor | None, like: torch.Tensor) -> tuple[torch.Tensor, int, bool]:
    """(int8 mask tensor or a dummy, row stride, whether there is a mask)."""
    if key_mask is None:
        return torch.zeros(1, dtype=torch.int8, device=like.device), 0, False
    mask = key_mask.to(torch.int8).contiguous()
    return mask, mask.stride(0), True


@triton.jit
def online_softmax_step(m_i, l_i, acc, s, v, DOT_PRECISION: tl.constexpr):
    """One block of a flash-style online softmax; ``s`` is masked with -inf (rows may be all -inf)."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp(m_i - m_use)
    p = tl.exp(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return m_new, l_i, acc


@triton.jit
def finish_softmax(m_i, l_i, acc):
    """(log-sum-exp, normalised output); an empty row gives (-inf, 0)."""
    return softmax_lse(m_i, l_i), acc / tl.where(l_i > 0, l_i, 1.0)[:, None]


@triton.jit
def softmax_lse(m_i, l_i):
    """Log-sum-exp of an online-softmax state (scalars or rows); -inf where nothing was summed."""
    has = l_i > 0
    return tl.where(has, tl.where(m_i == float("-inf"), 0.0, m_i) + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))


@triton.jit
def masked_tile_step(m_i, l_i, acc, q, kt, vt, kpos, k_ok, lo, hi, scale, DOT_PRECISION: tl.constexpr):
    """One key block of a span tile: each row (query, range) attends the keys in ``[lo, hi]``."""
    s = tl.dot(q, tl.trans(kt), input_precision=DOT_PRECISION) * scale
    allowed = k_ok[None, :] & (kpos[None, :] >= lo[:, None]) & (kpos[None, :] <= hi[:, None])
    s = tl.where(allowed, s, float("-inf"))
    return online_softmax_step(m_i, l_i, acc, s, vt, DOT_PRECISION)


@triton.jit
def store_pair_partials(LSE, OUT, ids, ok, d, d_ok, DIM, m_i, l_i, acc):
    """(lse, normalised output) of each pair ``ids`` of a span tile, fp32 ``[P]`` and ``[P, DIM]``."""
    lse, out = finish_softmax(m_i, l_i, acc)
    tl.store(LSE + ids, lse, mask=ok)
    tl.store(OUT + ids[:, None].to(tl.int64) * DIM + d[None, :], out, mask=ok[:, None] & d_ok[None, :])


# --------------------------------------------------------------------------------------------------
# Search: top-k sets of (score, anchor) slots


@triton.jit
def empty_softmax(ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """(running max, running sum, accumulator) of ``ROWS`` online softmaxes that have seen no key."""
    return tl.full([ROWS], float("-inf"), tl.float32), tl.zeros([ROWS], tl.float32), tl.zeros([ROWS, BLOCK_D], tl.float32)


@triton.jit
def row_block(pid_q, n_rows, DIM, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows ``pid_q * BLOCK_Q ..`` of a program over ``n_rows`` rows of ``DIM``-vectors: (row index,
    row valid, dim index, dim valid)."""
    rows = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    d = tl.arange(0, BLOCK_D)
    return rows, rows < n_rows, d, d < DIM


@triton.jit
def load_key_block(k_ptr, v_ptr, mask_row, kpos, k_ok, d, d_ok, stride_kl, stride_kd, stride_vl, stride_vd,
                   HAS_MASK: tl.constexpr):
    """Keys and values at positions ``kpos`` of one (batch row, KV head) of a contiguous cache, and
    which of them are real (``k_ok`` and, with a key mask, its row at ``mask_row``): (k_ok, K, V)."""
    if HAS_MASK:
        k_ok = k_ok & (tl.load(mask_row + kpos, mask=k_ok, other=0) != 0)
    kd_ok = k_ok[:, None] & d_ok[None, :]
    kt = tl.load(k_ptr + kpos[:, None].to(tl.int64) * stride_kl + d[None, :] * stride_kd, mask=kd_ok, other=0.0)
    vt = tl.load(v_ptr + kpos[:, None].to(tl.int64) * stride_vl + d[None, :] * stride_vd, mask=kd_ok, other=0.0)
    return k_ok, kt, vt


@triton.jit
def tile_pairs(PAIR_IDS, TILE_GROUP, TILE_FIRST, TILE_NBLK, SPAN_LO, SPAN_HI, t, HKV, TILE: tl.constexpr):
    """Tile ``t`` of ``tiling.build_span_tiles``: (blocks in its footprint, first block, row group,
    KV head, pair ids (0 in empty slots), which slots hold a pair, span starts, span ends)."""
    nblk = tl.load(TILE_NBLK + t)
    grp = tl.load(TILE_GROUP + t)
    first = tl.load(TILE_FIRST + t)
    ids = tl.load(PAIR_IDS + t.to(tl.int64) * TILE + tl.arange(0, TILE))
    ok = ids >= 0
    ids = tl.where(ok, ids, 0)
    lo = tl.load(SPAN_LO + ids, mask=ok, other=1)
    hi = tl.load(SPAN_HI + ids, mask=ok, other=0)
    return nblk, first, grp // HKV, grp % HKV, ids, ok, lo, hi


@triton.jit
def group_rows(pid_q, kvh, n_rows, G, DIM, GP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    """Rows of a search program: row ``g * BLOCK_Q + i`` is query head ``kvh * G + g`` of query ``i``
    of the block (``GP`` = G rounded up to a power of two; extra rows masked).

    Returns (query index, row valid, query head, dim index, dim valid)."""
    r = tl.arange(0, GP * BLOCK_Q)
    g = r // BLOCK_Q
    rows = pid_q * BLOCK_Q + r % BLOCK_Q
    row_ok = (rows < n_rows) & (g < G)
    d = tl.arange(0, BLOCK_D)
    return rows, row_ok, kvh * G + g, d, d < DIM


@triton.jit
def empty_topk(ROWS: tl.constexpr, KPAD: tl.constexpr, TOPK: tl.constexpr):
    """(slot index, scores, anchors) of ``ROWS`` empty top-k sets ``[ROWS, KPAD]``: slots beyond TOPK
    hold +inf so they are never the worst; empty slots -inf with distinct anchors -1, -2, ..."""
    slot = tl.arange(0, KPAD)
    ts = tl.where(slot[None, :] < TOPK, float("-inf"), float("inf")) + tl.zeros([ROWS, KPAD], tl.float32)
    ta = (-1 - slot[None, :]) + tl.zeros([ROWS, KPAD], tl.int32)
    return slot, ts, ta


@triton.jit
def empty_topk_row(KPAD: tl.constexpr, TOPK: tl.constexpr):
    """(slot index, scores, anchors) of one empty top-k set ``[KPAD]`` (as ``empty_topk``)."""
    slot = tl.arange(0, KPAD)
    return slot, tl.where(slot < TOPK, float("-inf"), float("inf")), -1 - slot


@triton.jit
def insert_group_candidates(ts, ta, q, kr, a_q, ok_q, row_ok, GP: tl.constexpr, BLOCK_Q: tl.constexpr,
                            BLOCK_D: tl.constexpr):
    """Score one stripe's keys ``kr`` ``[BLOCK_Q, D]`` (anchors ``a_q``) against every query head of
    the group (``q`` ``[GP * BLOCK_Q, D]`` fp32) and insert them into the rows' top-k sets."""
    k_rows = tl.reshape(tl.broadcast_to(kr[None, :, :], (GP, BLOCK_Q, BLOCK_D)), (GP * BLOCK_Q, BLOCK_D))
    a = tl.reshape(tl.broadcast_to(a_q[None, :], (GP, BLOCK_Q)), (GP * BLOCK_Q,))
    ok = tl.reshape(tl.broadcast_to(ok_q[None, :], (GP, BLOCK_Q)), (GP * BLOCK_Q,)) & row_ok
    s = tl.sum(q * k_rows, 1)
    worst = tl.min(ts, 1)
    worst_anchor = tl.max(tl.where(ts == worst[:, None], ta, -2147483647), 1)
    better = ok & ((s > worst) | ((s == worst) & (a < worst_anchor)))
    replace = (ts == worst[:, None]) & (ta == worst_anchor[:, None]) & better[:, None]
    return tl.where(replace, s[:, None], ts), tl.where(replace, a[:, None], ta)


@triton.jit
def store_topk(ANCHOR, SCORE, offsets, store_ok, ts, ta):
    """Write top-k sets (any shape): anchor -1 and score -inf for slots nothing filled."""
    found = ta >= 0
    tl.store(ANCHOR + offsets, tl.where(found, ta, -1), mask=store_ok)
    tl.store(SCORE + offsets, tl.where(found, ts, float("-inf")), mask=store_ok)


# --------------------------------------------------------------------------------------------------
# Decode: one query per program


@triton.jit
def load_query_row(Q, b, h, stride_qb, stride_qh, stride_qd, DIM, BLOCK_D: tl.constexpr):
    """(query fp32 ``[BLOCK_D]``, dim index, dim valid) of row ``b``, head ``h``."""
    d = tl.arange(0, BLOCK_D)
    d_ok = d < DIM
    q = tl.load(Q + b.to(tl.int64) * stride_qb + h.to(tl.int64) * stride_qh + d * stride_qd,
                mask=d_ok, other=0.0).to(tl.float32)
    return q, d, d_ok


@triton.jit
def stripe_block(STRIPE, pos, j0, n, BLOCK_S: tl.constexpr):
    """Anchors ``[BLOCK_S]`` of stripes ``j0 ..`` of the ``n`` of a decode query at ``pos``, and which
    of them are keys (in range, not before position 0)."""
    js = j0 + tl.arange(0, BLOCK_S)
    ok = js < n
    a = pos + 1 - tl.load(STRIPE + js, mask=ok, other=0)
    return a, ok & (a >= 0)


@triton.jit
def insert_block_best(ts, ta, q, kr, a, ok, TOPK: tl.constexpr):
    """Score a block of stripe keys ``kr`` ``[BLOCK_S, BLOCK_D]`` (anchors ``a``, where ``ok``) against
    the query row ``q`` and move the block's k best into one top-k set, one at a time (best of block;
    ties: the farther anchor)."""
    s = tl.where(ok, tl.sum(q[None, :] * kr, 1), float("-inf"))
    for r in tl.static_range(TOPK):
        best = tl.max(s, 0)
        best_anchor = tl.min(tl.where(ok & (s == best), a, 2147483647), 0)
        worst = tl.min(ts, 0)
        worst_anchor = tl.max(tl.where(ts == worst, ta, -2147483647), 0)
        better = (best_anchor != 2147483647) & ((best > worst) | ((best == worst) & (best_anchor < worst_anchor)))
        replace = (ts == worst) & (ta == worst_anchor) & better
        ts = tl.where(replace, best, ts)
        ta = tl.where(replace, best_anchor, ta)
        taken = a == best_anchor
        ok = ok & (~taken)
        s = tl.where(taken, float("-inf"), s)
    return ts, ta


@triton.jit
def decode_part_range(ANCHOR, BACK, FWD, pid, part, split, pos, first, WINDOW, MAX_T, SPLIT, TOPK: tl.constexpr):
    """Keys ``[lo, hi]`` of split ``split`` of part ``part`` of a decode query at ``pos``: the span of
    anchor ``part`` (exact integer tables; ``first`` = first real key), or the window for part TOPK."""
    a = tl.load(ANCHOR + pid * TOPK + tl.minimum(part, TOPK - 1))
    a = tl.where(part < TOPK, a, -1)
    seen = tl.minimum(tl.maximum(pos + 1 - first, 0), MAX_T)
    span_lo = tl.maximum(a - tl.load(BACK + seen), first)
    span_hi = tl.minimum(a + tl.load(FWD + seen), pos - WINDOW)
    span_hi = tl.where(a >= 0, span_hi, span_lo - 1)
    lo = tl.where(part < TOPK, span_lo, tl.maximum(pos - WINDOW + 1, 0))
    hi = tl.where(part < TOPK, span_hi, pos)
    lo = lo + split * SPLIT
    return lo, tl.minimum(hi, lo + SPLIT - 1)


@triton.jit
def empty_row_softmax(BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr):
    """Online-softmax state of one query: fp32 scalars (loop-carried) and a ``[BLOCK_D]`` accumulator."""
    m_i = tl.max(tl.full([BLOCK_K], float("-inf"), tl.float32), 0)
    l_i = tl.sum(tl.zeros([BLOCK_K], tl.float32), 0)
    return m_i, l_i, tl.zeros([BLOCK_D], tl.float32)


@triton.jit
def row_softmax_step(m_i, l_i, acc, q, kt, vt, k_ok, scale):
    """One key block ``kt``/``vt`` ``[BLOCK_K, D]`` (fp32) of one query's online softmax."""
    s = tl.where(k_ok, tl.sum(q[None, :] * kt, 1) * scale, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 0))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_use)
    alpha = tl.exp(m_i - m_use)
    return m_new, l_i * alpha + tl.sum(p, 0), acc * alpha + tl.sum(p[:, None] * vt, 0)


@triton.jit
def store_split_partial(PART_LSE, PART_OUT, pid, part, split, N_SPLIT, DIM, d, d_ok, m_i, l_i, acc,
                        TOPK: tl.constexpr):
    """(lse, normalised output) of one (query, part, split) of a decode step."""
    has = l_i > 0
    slot = (pid.to(tl.int64) * (TOPK + 1) + part) * N_SPLIT + split
    tl.store(PART_LSE + slot, softmax_lse(m_i, l_i))
    tl.store(PART_OUT + slot * DIM + d, acc / tl.where(has, l_i, 1.0), mask=d_ok)


# --------------------------------------------------------------------------------------------------
# Merge and gate


@triton.jit
def merge_span(acc, gate_sum, score_max, anchor, score, span_lse, span_out, win_lse, win_out):
    """Add one span's gated contribution (rows of a block) to ``acc``."""
    valid = anchor >= 0
    g = tl.where(valid, tl.exp(score - score_max), 0.0)
    top = tl.maximum(span_lse, win_lse)
    top = tl.where(top == float("-inf"), 0.0, top)
    a_span = tl.exp(span_lse - top)
    a_win = tl.exp(win_lse - top)
    den = a_span + a_win
    c = g / tl.where(den > 0, den, 1.0)
    acc = acc + (c * a_span)[:, None] * span_out + (c * a_win)[:, None] * win_out
    return acc, gate_sum + g


@triton.jit
def gate_rows(ANCHOR, SCORE, SPAN_LSE, SPAN_OUT, idx, span_stride, row_ok, d, io_mask, win_lse, win_out, DIM,
              TOPK: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_D: tl.constexpr):
    """Output rows ``[BLOCK_Q, BLOCK_D]`` of queries ``idx``: each span (partials at ``idx *
    span_stride + j``) merged with the window, gated by the softmax of the search scores; the window
    alone where no span is valid."""
    score_max = tl.full([BLOCK_Q], float("-inf"), tl.float32)
    for j in tl.static_range(TOPK):
        a = tl.load(ANCHOR + idx * TOPK + j, mask=row_ok, other=-1)
        sc = tl.load(SCORE + idx * TOPK + j, mask=row_ok, other=float("-inf"))
        score_max = tl.maximum(score_max, tl.where(a >= 0, sc, float("-inf")))
    score_max = tl.where(score_max == float("-inf"), 0.0, score_max)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)
    gate_sum = tl.zeros([BLOCK_Q], tl.float32)
    for j in tl.static_range(TOPK):
        a = tl.load(ANCHOR + idx * TOPK + j, mask=row_ok, other=-1)
        sc = tl.load(SCORE + idx * TOPK + j, mask=row_ok, other=float("-inf"))
        pair = idx * span_stride + j
        sl = tl.load(SPAN_LSE + pair, mask=row_ok, other=float("-inf"))
        so = tl.load(SPAN_OUT + pair[:, None] * DIM + d[None, :], mask=io_mask, other=0.0)
        acc, gate_sum = merge_span(acc, gate_sum, score_max, a, sc, sl, so, win_lse, win_out)
    return tl.where((gate_sum > 0)[:, None], acc / tl.where(gate_sum > 0, gate_sum, 1.0)[:, None], win_out)
