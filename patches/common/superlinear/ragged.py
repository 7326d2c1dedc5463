"""Superlinear attention over a serving batch: ragged requests whose K/V live in an engine's cache.

Engine-agnostic: vLLM's paged blocks and SGLang's token pool both come in as one
``toolkit.kernels.superlinear.paged.PagedKV``, and every engine, CPU or CUDA, runs the same two
kernel entry points through :func:`superlinear_ragged`:

* the batch's first ``num_decodes`` requests, one query row each (vLLM puts decodes first; an
  SGLang decode batch is all decodes), go through ``superlinear_decode_paged`` (on CUDA: static
  shapes, no host synchronisation, so a CUDA graph can capture it);
* the other requests (prompts, prefill chunks over a cached prefix, and single-token rows the
  engine did not count as decodes) through ``superlinear_attention_paged``.

On CPU (``impl`` gather/naive) each prompt or chunk reads its prefix and single-token rows read
only their stripes, window and spans; with ``triton`` the kernels read K/V through the block table.
Search and attention use the same query (models with one query projection).

Imports torch and the kernels only.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from toolkit.kernels.superlinear.paged import PagedKV, superlinear_attention_paged, superlinear_decode_paged
from toolkit.patches.common.superlinear.config import SuperlinearConfig


def superlinear_ragged(query: torch.Tensor, kv: PagedKV, query_start: torch.Tensor | Sequence[int],
                       config: SuperlinearConfig, scale: float, out: torch.Tensor, num_decodes: int = 0,
                       max_seq_len: int | None = None) -> torch.Tensor:
    """Write superlinear attention of ``query`` ``[T, H_Q, D]`` into ``out`` ``[T, H_Q, D]``.

    Request ``r`` owns rows ``query_start[r]:query_start[r + 1]`` (``R + 1`` entries, a host list or
    a device tensor) at the last positions of its ``kv.seq_lens[r]`` tokens; requests
    ``0 .. num_decodes - 1`` own exactly row ``r`` each.  ``max_seq_len``: the decode's static bound
    on ``seq_lens`` (default the block table's capacity).
    """
    kwargs = config.kernel_kwargs()
    if num_decodes:
        superlinear_decode_paged(query[:num_decodes], kv.narrow(0, num_decodes), scale=scale, impl=config.impl,
                                 out=out[:num_decodes], max_seq_len=max_seq_len, **kwargs)
    rest = kv.num_requests - num_decodes
    if rest > 0:
        # The entries of the non-decode requests only (an engine's buffer may be longer).
        starts = query_start[num_decodes:kv.num_requests + 1]
        if isinstance(starts, torch.Tensor):
            starts = starts - num_decodes
        else:
            starts = [int(n) - num_decodes for n in starts]
        superlinear_attention_paged(query[num_decodes:], kv.narrow(num_decodes, rest), starts, scale=scale,
                                    impl=config.impl, out=out[num_decodes:], **kwargs)
    return out
