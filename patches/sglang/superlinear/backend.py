"""The ``superlinear`` SGLang attention backend: SGLang's ``torch_native`` backend with superlinear attention.

Same token-level KV pool, same cache writes and metadata as ``torch_native``; the per-request SDPA
of ``forward_extend`` (prefill, chunked prefill) and ``forward_decode`` is replaced by
``toolkit.kernels.superlinear`` over each request's K/V read through ``req_to_token``. Cross-attention,
encoder layers and sliding-window layers keep the torch_native path. Configuration: environment
(``TOOLKIT_SUPERLINEAR_*``, see ``toolkit.patches.common.superlinear.config``), validated when the backend is
built (server start-up). Works with SGLang 0.5.9 and 0.5.23 (their ``_run_sdpa_forward_*`` helpers
differ only in trailing keyword arguments).

Runs inside SGLang's processes: imports SGLang, torch and the kernels, nothing of the patch engine.
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

from toolkit.patches.common.superlinear.config import load_config
from toolkit.patches.common.superlinear.ragged import superlinear_ragged

logger = logging.getLogger(__name__)

NAME = "superlinear"


def _plain(encoder_lens, kwargs) -> bool:
    """Whether a call is ordinary causal self-attention of a decoder (what superlinear replaces)."""
    window = kwargs.get("sliding_window_size")
    return (encoder_lens is None and not kwargs.get("is_cross_attn", False)
            and (window is None or window < 0))


class SuperlinearAttnBackend(TorchNativeAttnBackend):
    def __init__(self, model_runner):
        super().__init__(model_runner)
        self.superlinear = load_config()
        logger.info("superlinear attention on (%s)", self.superlinear.describe())

    def _superlinear(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                     query_lens, scaling):
        seq_list = [int(n) for n in seq_lens.tolist()]
        starts = [0]
        for n in query_lens:
            starts.append(starts[-1] + int(n))
        pool_rows = req_pool_indices.tolist()
        scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5

        def read_kv(r, positions):
            rows = req_to_token[pool_rows[r]]
            tokens = rows.index_select(0, positions.to(rows.device, torch.int64)).to(torch.int64)
            k = k_cache.index_select(0, tokens).movedim(0, 1)
            v = v_cache.index_select(0, tokens).movedim(0, 1)
            return k.to(query.dtype), v.to(query.dtype)

        def fetch_kv(r, n):
            return read_kv(r, torch.arange(n, device=req_to_token.device))

        superlinear_ragged(query, starts, seq_list, fetch_kv, read_kv, self.superlinear, scale, output)
        return output

    def _run_sdpa_forward_extend(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                                 seq_lens, extend_prefix_lens, extend_seq_lens, *rest, **kwargs):
        encoder_lens = rest[0] if rest else kwargs.get("encoder_lens")
        if not kwargs.get("causal", False) or not _plain(encoder_lens, kwargs) or len(rest) > 1:
            return super()._run_sdpa_forward_extend(query, output, k_cache, v_cache, req_to_token,
                                                    req_pool_indices, seq_lens, extend_prefix_lens,
                                                    extend_seq_lens, *rest, **kwargs)
        return self._superlinear(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                 extend_seq_lens.tolist(), kwargs.get("scaling"))

    def _run_sdpa_forward_decode(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                                 seq_lens, *rest, **kwargs):
        encoder_lens = rest[0] if rest else kwargs.get("encoder_lens")
        if not _plain(encoder_lens, kwargs) or len(rest) > 1:
            return super()._run_sdpa_forward_decode(query, output, k_cache, v_cache, req_to_token,
                                                    req_pool_indices, seq_lens, *rest, **kwargs)
        return self._superlinear(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                 [1] * int(seq_lens.shape[0]), kwargs.get("scaling"))


def create_superlinear_backend(runner):
    """The factory SGLang's attention registry calls for ``--attention-backend superlinear``."""
    if getattr(runner, "use_mla_backend", False):
        raise ValueError("superlinear attention supports multi-head/grouped-query attention models, not MLA")
    return SuperlinearAttnBackend(runner)
