"""Helpers shared by the Triton kernels' launchers."""

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
    has = l_i > 0
    lse = tl.where(has, tl.where(m_i == float("-inf"), 0.0, m_i) + tl.log(tl.where(has, l_i, 1.0)), float("-inf"))
    out = acc / tl.where(has, l_i, 1.0)[:, None]
    return lse, out
