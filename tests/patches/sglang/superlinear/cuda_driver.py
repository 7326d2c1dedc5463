"""Driver (run by test_cuda_path.py in a real SGLang venv): the backend's CUDA path on CPU tensors.

Usage: ``python cuda_driver.py`` with ``TRITON_INTERPRET=1`` and ``TOOLKIT_SUPERLINEAR_IMPL=triton``;
writes a JSON result to ``$TOOLKIT_TEST_RESULT_FILE``.  SGLang's own parts: ``ReqToTokenPool`` and
``MHATokenToKVPool`` (the pool's own ``set_kv_buffer`` writes K/V), ``RadixAttention`` layers,
``ForwardBatch`` in extend and decode modes, the backend's ``forward_extend`` / ``forward_decode``
and its CUDA-graph hooks.  The one stand-in is the model runner handed to the backend (a namespace
with the device and the two pools: a real ``ModelRunner`` loads a model and a GPU).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo, for the result channel
from tests.harness.channel import write_result  # noqa: E402
from tests.harness.host_reads import plain, request_data  # noqa: E402

sys.path.pop(0)

HQ, HKV, D = 4, 2, 32
COVERING = {"sw_index": 7, "backward_factor": 8.0, "forward_factor": 8.0}
COVERING_LEN = 168


def main(make_backend=None, replay: bool = True, quick: bool = False) -> dict:
    """The cases' results; the backend is ``make_backend(runner)`` (default: the class itself). Without
    ``replay``, no decode replay under the host-read guard (which the CPU gather path trips); ``quick``:
    the window-and-spans case only, on shorter requests (still past the window: spans are selected)."""
    from sglang.srt.layers.radix_attention import RadixAttention
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    from toolkit.kernels.superlinear.dispatch import superlinear_attention
    from toolkit.kernels.superlinear.triton import paged_decode, paged_prefill
    from toolkit.patches.sglang.superlinear.backend import SuperlinearAttnBackend

    slots, width = 2048, 512
    req_pool = ReqToTokenPool(size=8, max_context_len=width, device="cpu", enable_memory_saver=False)
    kv_pool = MHATokenToKVPool(slots, page_size=1, dtype=torch.float32, head_num=HKV, head_dim=D, layer_num=1,
                               device="cpu", enable_memory_saver=False)
    for buf in (kv_pool.k_buffer[0], kv_pool.v_buffer[0]):
        buf.fill_(float("nan"))  # a slot no request owns shows up in the output
    pools = dict(req_to_token_pool=req_pool, token_to_kv_pool=kv_pool)
    batch_fields = {f.name for f in dataclasses.fields(ForwardBatch)}
    runner = SimpleNamespace(device="cpu", **pools)
    layer = RadixAttention(HQ, D, D ** -0.5, HKV, layer_id=0)
    g = torch.Generator().manual_seed(0)
    free = iter(torch.randperm(slots - 1, generator=g).tolist())  # pool slot 0 is SGLang's padding slot

    def grid(*shape):
        return torch.randint(-8, 9, shape, generator=g).float() / 4

    results = {"kernels_interpreted": all(type(k).__name__ == "InterpretedFunction"
                                          for k in (paged_prefill._paged_search_kernel,
                                                    paged_decode._paged_decode_span_kernel))}
    dense: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # pool row -> all K/V written so far

    def batch(mode, rows, new_lens, backend):
        """Run one forward of ``mode`` in which request rows ``rows`` add ``new_lens`` tokens."""
        locs, qs = [], []
        for row, n in zip(rows, new_lens):
            k_old, v_old = dense.get(row, (torch.zeros(0, HKV, D), torch.zeros(0, HKV, D)))
            start = k_old.shape[0]
            loc = torch.tensor([next(free) + 1 for _ in range(n)])
            req_pool.req_to_token[row, start:start + n] = loc.to(req_pool.req_to_token.dtype)
            k, v = grid(n, HKV, D), torch.randn(n, HKV, D, generator=g)
            dense[row] = (torch.cat([k_old, k]), torch.cat([v_old, v]))
            locs.append(loc)
            qs.append(grid(n, HQ, D))
        seq_lens = torch.tensor([dense[row][0].shape[0] for row in rows])
        new = torch.tensor(new_lens)
        fb = ForwardBatch(forward_mode=mode, batch_size=len(rows), input_ids=torch.zeros(int(new.sum()), dtype=torch.long),
                          req_pool_indices=torch.tensor(rows), seq_lens=seq_lens, out_cache_loc=torch.cat(locs),
                          seq_lens_sum=int(seq_lens.sum()),
                          **{k: v for k, v in pools.items() if k in batch_fields})  # 0.5.23: the backend holds them
        if mode.is_extend():
            fb.extend_prefix_lens = seq_lens - new
            fb.extend_seq_lens = new
        q = torch.cat(qs)
        k_new = torch.cat([dense[row][0][-n:] for row, n in zip(rows, new_lens)])
        v_new = torch.cat([dense[row][1][-n:] for row, n in zip(rows, new_lens)])
        call = backend.forward_extend if mode.is_extend() else backend.forward_decode
        out = call(q.reshape(q.shape[0], -1), k_new, v_new, layer, fb).view(-1, HQ, D)
        return q, out, seq_lens, fb

    def reference(q, rows, new_lens, params, as_dense=False):
        ref, at = torch.empty_like(q), 0
        for row, n in zip(rows, new_lens):
            k, v = (x.transpose(0, 1) for x in dense[row])
            m = k.shape[1]
            qq = q[at:at + n].transpose(0, 1)[None]
            if as_dense:
                kk, vv = (x.double().repeat_interleave(HQ // HKV, 0)[None] for x in (k, v))
                mask = torch.arange(m)[None, :] <= torch.arange(m - n, m)[:, None]
                r = torch.nn.functional.scaled_dot_product_attention(qq.double(), kk, vv, attn_mask=mask)
            else:
                r = superlinear_attention(qq, qq, k[None], v[None], torch.arange(m - n, m), impl="naive", **params)
            ref[at:at + n] = r[0].transpose(0, 1).float()
            at += n
        return ref

    def err(a, b):
        return float((a - b).abs().max())

    cases = {}
    for name, params in (("window_spans", {"sw_index": 2, "topk": 2, "forward_factor": 1.0}),
                         ("covering", COVERING))[:1 if quick else 2]:
        dense.clear()
        req_pool.req_to_token.zero_()
        os.environ["TOOLKIT_SUPERLINEAR_CONFIG"] = json.dumps(params)
        backend = (make_backend or SuperlinearAttnBackend)(runner)
        rows = [3, 0, 5]
        # Covering: every request stays within COVERING_LEN tokens through the last decode step.
        first = ([40, 23, 31] if quick else [150, 97, 120]) if name == "window_spans" else [COVERING_LEN - 70, 60, 40]
        q, out, _, _ = batch(ForwardMode.EXTEND, rows, first, backend)  # prompts
        case = {"prompts": err(out, reference(q, rows, first, params))}
        more = [16, 1, 9] if quick else [64, 1, 30]  # a chunk over a cached prefix, a one-token extend, another chunk
        q, out, _, _ = batch(ForwardMode.EXTEND, rows, more, backend)
        case["chunks"] = err(out, reference(q, rows, more, params))
        if name == "covering":
            case["chunks_vs_dense"] = err(out, reference(q, rows, more, params, as_dense=True))
        q, out, _, _ = batch(ForwardMode.DECODE, rows, [1, 1, 1], backend)
        case["decode"] = err(out, reference(q, rows, [1, 1, 1], params))
        if name == "covering":
            case["decode_vs_dense"] = err(out, reference(q, rows, [1, 1, 1], params, as_dense=True))
        cases[name] = case

    # CUDA-graph hooks: capture a decode batch, then replay it with the next step's lengths
    # written into the same seq_lens tensor (SGLang's static buffers).
    backend.init_cuda_graph_state(8, 8)
    rows = [3, 0, 5]
    q, out, seq_lens, fb = batch(ForwardMode.DECODE, rows, [1, 1, 1], backend)
    backend.init_forward_metadata_capture_cuda_graph(3, 3, fb.req_pool_indices, fb.seq_lens, None,
                                                     ForwardMode.DECODE, None)
    try:
        backend.init_forward_metadata_capture_cuda_graph(3, 3, fb.req_pool_indices, fb.seq_lens, None,
                                                         ForwardMode.EXTEND, None)
        results["extend_capture_refused"] = False
    except ValueError as exc:
        results["extend_capture_refused"] = "decode batches only" in str(exc)
    results["seq_len_fill_value"] = backend.get_cuda_graph_seq_len_fill_value()
    if not replay:
        results["cases"] = cases
        return results
    step_q, step_k, step_v = grid(3, HQ, D), grid(3, HKV, D), torch.randn(3, HKV, D, generator=g)
    locs = torch.tensor([next(free) + 1 for _ in range(3)])
    for i, row in enumerate(rows):
        n = dense[row][0].shape[0]
        req_pool.req_to_token[row, n] = int(locs[i])
        dense[row] = (torch.cat([dense[row][0], step_k[i:i + 1]]), torch.cat([dense[row][1], step_v[i:i + 1]]))
    fb.seq_lens.add_(1)
    fb.out_cache_loc.copy_(locs)
    backend.init_forward_metadata_replay_cuda_graph(3, fb.req_pool_indices, fb.seq_lens, int(fb.seq_lens.sum()),
                                                    None, ForwardMode.DECODE, None, fb.seq_lens.clone())
    # What the graph replays, with every request tensor refusing host reads (no sync, no data-
    # dependent shape): the pool write, the pools, the lengths, the rows, the step's q/k/v.
    kv_pool.k_buffer[0] = request_data(kv_pool.k_buffer[0])
    kv_pool.v_buffer[0] = request_data(kv_pool.v_buffer[0])
    req_pool.req_to_token = request_data(req_pool.req_to_token)
    guarded = dataclasses.replace(fb, seq_lens=request_data(fb.seq_lens), req_pool_indices=request_data(fb.req_pool_indices),
                                  out_cache_loc=request_data(fb.out_cache_loc))
    try:
        replay = plain(backend.forward_decode(request_data(step_q.reshape(3, -1)), request_data(step_k),
                                              request_data(step_v), layer, guarded)).view(-1, HQ, D)
        replay_error = err(replay, reference(step_q, rows, [1, 1, 1], COVERING))
    except AssertionError as exc:
        replay_error = str(exc)
    cases["graph_replay"] = {"decode": replay_error}
    results["cases"] = cases
    return results


if __name__ == "__main__":
    write_result(main())
