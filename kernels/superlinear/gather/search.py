"""The stripe search: each query's top-k anchors among the keys on its stripes.

Candidates (``workspace.offset_positions``) lie at ``q + 1 - F(i)``; their keys are gathered once per
KV head and scored against the G query heads of the group (one mat-mul); ``select_topk`` picks the
exact top-k (ties as ``attention_spans.ordered_score_key`` orders them) and ``pick_anchors`` turns
it into anchors and scores.  ``search_rows`` does this for a prefill chunk (blocked, in a
``Workspace``), ``search_decode`` for one query per batch row.
"""

from __future__ import annotations

import torch

from ..attention_spans import SpanGeometry, ordered_score_key
from . import native
from .workspace import (
    NEG_INF,
    SELECT_ELEMENTS,
    TEMP_ELEMENTS,
    KeyRow,
    Workspace,
    chunks,
    offset_positions,
    row_keys,
)

# Queries per top-k block at most: blocks this small follow the stripe count closely (one more
# stripe every ~2 sqrt(q) positions) at a few torch ops each.
QUERY_BLOCK = 4096


def _top_values(x: torch.Tensor, count: int, last_value_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Largest ``count`` values of the last axis, best first (any order among equal values), and
    their indices (``count - 1`` of them with ``last_value_only``: the last value is only compared).

    For a handful of values, rounds of max-and-remove beat ``torch.topk`` on CPU by about a third;
    ``x`` is restored afterwards.
    """
    if count > 8:
        top_values, top_indices = x.topk(count, dim=-1)
        return top_values, top_indices[..., : count - 1] if last_value_only else top_indices
    values: list[torch.Tensor] = []
    indices: list[torch.Tensor] = []
    for r in range(count):
        if last_value_only and r + 1 == count:
            values.append(x.amax(dim=-1, keepdim=True))  # no index needed: a quarter of the cost
            break
        v, i = x.max(dim=-1, keepdim=True)
        values.append(v)
        indices.append(i)
        if r + 1 < count:
            x.scatter_(-1, i, NEG_INF)
    # Restore in reverse: once a row runs out of finite values, max may return an index already
    # taken; the earliest (real) value must be written last.
    for v, i in zip(reversed(values[: len(indices)]), reversed(indices)):
        x.scatter_(-1, i, v)
    return torch.cat(values, -1), torch.cat(indices, -1)


def select_topk(scores: torch.Tensor, valid: torch.Tensor | None, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k over the last axis of ``scores`` (candidates in stripe order, nearest first).

    ``valid`` (broadcasting against ``scores``, None = all) marks real candidates; ``scores`` is
    masked in place.  Returns indices ``[..., k]`` best first and whether each is a real candidate.
    Ties are broken as ``attention_spans.ordered_score_key`` says (the farther stripe wins).  A float top-k
    of k + 1 finds the winners; only rows whose k-th and (k+1)-th scores are equal (a tie at the
    boundary: exactly equal dot products) are redone with the exact integer key.
    """
    n = scores.shape[-1]
    kk = min(topk, n)
    masked = scores if valid is None else scores.masked_fill_(~valid, NEG_INF)
    top, idx = _top_values(masked, min(kk + 1, n), last_value_only=n > kk)
    if n > kk:
        tie = (top[..., kk - 1] == top[..., kk]) & (top[..., kk - 1] > NEG_INF)  # -0.0 == +0.0 too
        top = top[..., :kk]
        if bool(tie.any()):
            rows = tie.nonzero(as_tuple=True)
            tied = masked[rows]
            exact = ordered_score_key(tied, torch.arange(n, device=scores.device), tied > NEG_INF)
            idx, top = idx.clone(), top.clone()
            idx[rows] = exact.topk(kk, dim=-1).indices
            top[rows] = torch.gather(tied, -1, idx[rows])
    # Rows with fewer than k candidates end in -inf entries (whose indices may repeat): not found.
    found = top > NEG_INF
    # Canonical order inside the k (score, then farther stripe), on k values only.
    order = ordered_score_key(top, idx, found).argsort(dim=-1, descending=True)
    return torch.gather(idx, -1, order), torch.gather(found, -1, order)


def pick_anchors(scores: torch.Tensor, cand: torch.Tensor, valid: torch.Tensor | None, topk: int,
                 anchors: torch.Tensor, best_scores: torch.Tensor) -> None:
    """Write the top-k of ``scores`` ``[..., n]`` (``valid`` and ``cand``, the candidates' key
    positions, broadcasting against it) into ``anchors`` (-1 = none) and ``best_scores`` (-inf = none),
    ``[..., topk]``, best first."""
    best, found = select_topk(scores, valid, topk)
    kk = best.shape[-1]
    picked = torch.gather(cand.expand(scores.shape), -1, best)
    anchors[..., :kk] = torch.where(found, picked, -1)
    best_scores[..., :kk] = torch.where(found, torch.gather(scores, -1, best), NEG_INF)


def search_rows(q1_rows: torch.Tensor, keys: KeyRow, positions: torch.Tensor, geometry: SpanGeometry,
                topk: int, ws: Workspace):
    """Top-k anchors for the queries of one batch row.

    q1_rows: ``[H_KV, G, C, D]`` fp32; positions ``[C]``.  Returns anchors ``[H_KV, G, C, k]``
    int64 (-1 = none) and scores fp32 (-inf = none), best first.

    Scores are computed in small blocks (the gathered keys stay in cache) into one larger buffer,
    and the top-k runs once per large block: every torch op is a synchronisation point of the
    intra-op thread pool, and on a busy machine each costs up to a scheduler time slice.
    """
    kv_heads, group, count, dim = q1_rows.shape
    device = q1_rows.device
    if native.usable(q1_rows, keys.k_flat):
        q_by_query = ws.get("search_q", (count, kv_heads, group, dim))
        q_by_query.copy_(q1_rows.permute(2, 0, 1, 3))
        anchors, scores = native.native_search(q_by_query, keys.k_flat, keys.key_len, positions,
                                               geometry.stripe_distance, geometry.stripe_count, keys.mask, topk)
        return anchors.permute(1, 2, 0, 3).contiguous(), scores.permute(1, 2, 0, 3).contiguous()
    anchors = torch.full((count, kv_heads, group, topk), -1, dtype=torch.int64, device=device)
    scores = torch.full((count, kv_heads, group, topk), NEG_INF, device=device)
    most = int(geometry.stripe_count[int(positions.max())]) if count else 0
    if most > 0:
        # Query-major layouts: every block of queries is one contiguous slice of each buffer.
        q_by_query = ws.get("search_q", (count, kv_heads, group, dim))
        q_by_query.copy_(q1_rows.permute(2, 0, 1, 3))
        head_offset = (torch.arange(kv_heads, device=device) * keys.key_len)[None, :, None]
        gather_step = max(1, TEMP_ELEMENTS // max(1, kv_heads * most * dim))
        select_step = max(gather_step, SELECT_ELEMENTS // max(1, kv_heads * group * most))
        for lo, hi in chunks(count, min(select_step, QUERY_BLOCK)):
            # Each block of queries scores only as many stripes as its last query has (early
            # queries of a long prefill have far fewer than the chunk's last one).
            stripes = int(geometry.stripe_count[int(positions[lo:hi].max())])
            if stripes == 0:
                continue
            offsets = 1 - geometry.stripe_distance[:stripes].to(device)
            cand, valid = offset_positions(positions[lo:hi], offsets, keys.mask)  # [c, n]
            all_valid = keys.mask is None and bool(valid.all())
            rows = cand[:, None, :] + head_offset  # [c, H_KV, n]
            s_t = ws.get("search_scores_t", (hi - lo, kv_heads, stripes, group))
            for a, b in chunks(hi - lo, gather_step):
                # One gather of the stripe keys serves the G query heads of each KV head; keys x
                # queries ([n, D] x [D, G] per query) runs about twice as fast as queries x keys.
                k_st = ws.get("search_keys", ((b - a) * kv_heads * stripes, dim))
                torch.index_select(keys.k_flat, 0, rows[a:b].reshape(-1), out=k_st)
                torch.matmul(k_st.view(b - a, kv_heads, stripes, dim), q_by_query[lo + a:lo + b].transpose(-1, -2),
                             out=s_t[a:b])
            s = ws.get("search_scores", (hi - lo, kv_heads, group, stripes))
            s.copy_(s_t.transpose(-1, -2))
            pick_anchors(s, cand[:, None, None, :], None if all_valid else valid[:, None, None, :], topk,
                         anchors[lo:hi], scores[lo:hi])
    return anchors.permute(1, 2, 0, 3).contiguous(), scores.permute(1, 2, 0, 3).contiguous()


def search_decode(q1: torch.Tensor, k: torch.Tensor, pos: torch.Tensor, key_mask: torch.Tensor | None,
                  geometry: SpanGeometry, topk: int):
    """Top-k anchors of one query per batch row: q1 ``[B, H_KV, G, D]`` fp32 at positions ``pos``
    ``[B]`` over ``k`` ``[B, H_KV, L_KV, D]``.  Returns anchors and scores ``[B, H_KV, G, k]``."""
    batch, kv_heads, group, _ = q1.shape
    device = q1.device
    anchors = torch.full((batch, kv_heads, group, topk), -1, dtype=torch.int64, device=device)
    scores = torch.full((batch, kv_heads, group, topk), NEG_INF, device=device)
    stripes = int(geometry.stripe_count[int(pos.max())])
    if stripes > 0:
        cand, valid = offset_positions(pos, 1 - geometry.stripe_distance[:stripes].to(device), key_mask)  # [B, n]
        s = torch.matmul(q1, row_keys(k, cand[:, None, :]).transpose(-1, -2))  # [B, H_KV, G, n]
        pick_anchors(s, cand[:, None, None, :], valid[:, None, None, :], topk, anchors, scores)
    return anchors, scores
