"""The ``superlinear`` SGLang attention backend: SGLang's ``torch_native`` backend with superlinear attention.

Same token-level KV pool, same cache writes and metadata as ``torch_native``; the per-request SDPA
of ``forward_extend`` (prefill, chunked prefill) and ``forward_decode`` is replaced by the kernels'
paged interface (``toolkit.kernels.superlinear.paged``) over the pool and ``req_to_token``: on CPU
the gather path, on CUDA the Triton kernels reading K/V straight from the pool, with decode
captured in SGLang's CUDA graphs (static shapes, no host synchronisation). Cross-attention,
encoder layers and sliding-window layers keep the torch_native path. Configuration: environment
(``TOOLKIT_SUPERLINEAR_*``, see ``toolkit.patches.common.superlinear.config``), validated when the backend is
built (server start-up). Works with every SGLang release 0.5.9-0.5.23 (their ``_run_sdpa_forward_*``
helpers differ only in trailing keyword arguments; tests/patches/sglang/superlinear/test_releases.py).

Runs inside SGLang's processes: imports SGLang, torch and the kernels, nothing of the patch engine.
"""

from __future__ import annotations

import logging

import torch
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend

from toolkit.kernels.superlinear.paged import PagedKV
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

    # CUDA graphs (SGLang keeps them on for this backend, unlike torch_native): a decode step reads
    # only the forward batch's own tensors (req_pool_indices, seq_lens, the pools), which the graph
    # runner keeps in static buffers, and the decode kernel has static shapes and no host
    # synchronisation, so there is no metadata to prepare. Signatures differ across SGLang lines.
    def init_cuda_graph_state(self, *args, **kwargs) -> None:
        pass

    def init_forward_metadata_capture_cuda_graph(self, *args, **kwargs) -> None:
        mode = kwargs.get("forward_mode", args[5] if len(args) > 5 else None)
        if mode is not None and not (mode.is_decode() or mode.is_idle()):
            raise ValueError(f"superlinear attention captures decode batches only, not {mode.name}; "
                             "run without speculative decoding or with --disable-cuda-graph")

    def init_forward_metadata_replay_cuda_graph(self, *args, **kwargs) -> None:
        pass

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1  # padding rows of a captured batch attend their first key (then are dropped)

    def _same_dtype(self, query, k_cache) -> bool:
        """The kernels read the pool as it is: a pool of another dtype (fp8) keeps torch_native."""
        if k_cache.dtype == query.dtype:
            return True
        if not getattr(self, "_warned_dtype", False):
            self._warned_dtype = True
            logger.warning("superlinear attention: KV pool dtype %s differs from the query's %s; "
                           "these layers keep torch_native attention", k_cache.dtype, query.dtype)
        return False

    def _superlinear(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                     query_start, scaling, decode: bool):
        kv = PagedKV.from_token_pool(k_cache, v_cache, req_to_token, req_pool_indices, seq_lens)
        scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
        # A decode batch is one row per request: the decode kernel (static shapes on CUDA, bounded
        # by the pool's context width).
        superlinear_ragged(query, kv, query_start, self.superlinear, scale, output,
                           num_decodes=kv.num_requests if decode else 0, max_seq_len=kv.capacity)
        return output

    def _run_sdpa_forward_extend(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                                 seq_lens, extend_prefix_lens, extend_seq_lens, *rest, **kwargs):
        encoder_lens = rest[0] if rest else kwargs.get("encoder_lens")
        if (not kwargs.get("causal", False) or not _plain(encoder_lens, kwargs) or len(rest) > 1
                or not self._same_dtype(query, k_cache)):
            return super()._run_sdpa_forward_extend(query, output, k_cache, v_cache, req_to_token,
                                                    req_pool_indices, seq_lens, extend_prefix_lens,
                                                    extend_seq_lens, *rest, **kwargs)
        query_start = torch.nn.functional.pad(torch.cumsum(extend_seq_lens, 0), (1, 0))
        return self._superlinear(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                 query_start, kwargs.get("scaling"), decode=False)

    def _run_sdpa_forward_decode(self, query, output, k_cache, v_cache, req_to_token, req_pool_indices,
                                 seq_lens, *rest, **kwargs):
        encoder_lens = rest[0] if rest else kwargs.get("encoder_lens")
        if not _plain(encoder_lens, kwargs) or len(rest) > 1 or not self._same_dtype(query, k_cache):
            return super()._run_sdpa_forward_decode(query, output, k_cache, v_cache, req_to_token,
                                                    req_pool_indices, seq_lens, *rest, **kwargs)
        return self._superlinear(query, output, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens,
                                 None, kwargs.get("scaling"), decode=True)


def create_superlinear_backend(runner):
    """The factory SGLang's attention registry calls for ``--attention-backend superlinear``."""
    if getattr(runner, "use_mla_backend", False):
        raise ValueError("superlinear attention supports multi-head/grouped-query attention models, not MLA")
    return SuperlinearAttnBackend(runner)
