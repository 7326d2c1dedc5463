"""Merge: each span's partials joined with the window's (log-sum-exp), the k results mixed by the
softmax of the search scores."""

from __future__ import annotations

import torch

from .workspace import NEG_INF


def merge_and_gate(span_lse, span_out, win_lse, win_out, anchors, scores):
    """Mix the k span outputs (each merged with the window) by the softmax of the search scores.

    span_*: ``[..., k]`` (+ ``D``); win_*: ``[...]`` (+ ``D``; None when there is no window).
    Returns ``[..., D]`` fp32.

    O_j = (e^lse_j o_j + e^lse_w o_w) / (e^lse_j + e^lse_w) and out = sum_j g_j O_j, rearranged
    so that only per-(query, span) scalars are computed before one weighted sum of D-vectors.
    """
    wl = win_lse[..., None]
    top = torch.maximum(span_lse, wl)
    top = torch.where(top > NEG_INF, top, 0.0)
    a_span = torch.exp(span_lse - top)  # exp(-inf) = 0 for an empty part
    a_win = torch.exp(wl - top)
    den = a_span + a_win
    found = anchors >= 0
    gate = torch.softmax(scores.masked_fill(~found, NEG_INF), dim=-1)
    # No valid span: every O_j is the window alone and the gate is uniform.
    gate = torch.where(found.any(-1, keepdim=True), gate, 1.0 / gate.shape[-1])
    g = gate / torch.where(den > 0, den, 1.0)  # a query with no key at all outputs 0
    coef_span = g * a_span
    coef_win = (g * a_win).sum(-1)
    if win_out is None:
        out = torch.zeros(span_out.shape[:-2] + span_out.shape[-1:], device=span_out.device)
    else:
        out = coef_win[..., None] * win_out
    for j in range(span_out.shape[-2]):  # k is small: k fused multiply-adds beat a batched matmul
        out.addcmul_(coef_span[..., j, None], span_out[..., j, :])
    return out
