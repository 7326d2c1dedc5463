"""Worker side of the batched sweep: every cell of a grid in one call, recomputing only what a patch changes.

A cell patches the residual stream at layer ``L`` (``pre_attn``: the layer's input; ``post_block``: its
output) at positions ``P``. Nothing before ``min(P)`` changes, at any layer, and nothing at layers below
the patch changes at all. So after one pass of the corrupt prompt that keeps each layer's input stream
and each attention layer's K/V, a cell only runs the layers from its patch up, over the rows from
``min(P)`` on, its attention reading the corrupt run's K/V for the positions before. Only the last
position's output is read at the end, so a cell whose only layer to run is the last one runs just its
patched rows (the only K/V that differ) and the last row. The cells of a grid go through those layers
together, one batch of rows per chunk, in this process, between two engine steps: no scheduler round
trip per cell, no KV cache written, nothing shared with any request.

The layers run as the engine's own modules (norms, projections, rotary embedding, MLP), so any model
whose decoder layers take ``(positions, hidden_states, residual)`` is served; only the attention kernel
is swapped, for the duration of the call, for causal SDPA over the rows' K/V and the stored prefix.
Attention this kernel would compute differently (sliding windows, sinks, soft caps, ALiBi, shared KV,
quantized queries) makes the sweep go the per-request way (``unsupported``), never a wrong number.

The layers run inside vLLM's forward context, as in an engine step (a fused MoE layer finds itself there by
name); no attention metadata is set, since the swapped attention reads none. Whatever else a model's layers
need that a call between engine steps cannot give is found before the first sweep: ``probe`` runs two
tokens through every layer at install, and a model it fails on is served by requests, the failure named.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import torch

MAX_CHUNK_ELEMENTS = 64 << 20  # a chunk of cells' padded queries ([cells, n, heads, head_size]) at most


@dataclass
class _Kernel:
    """What the swapped-in attention does in the current call. The corrupt pass (``record``): causal
    attention over its own rows, keeping each layer's K/V. Cells: row ``r`` of the batch is position
    ``positions[r]`` of cell ``cells[r]``; every cell's keys are the corrupt run's with its own rows written
    over them, so each cell is one [n, n] causal problem and all go in one SDPA call. At the last layer
    only each cell's last row is read afterwards (``last_rows``), so only those rows attend."""

    layer: int = 0
    last_layer: int = 0
    record: bool = False
    cells: torch.Tensor | None = None  # [rows] cell index of each row
    positions: torch.Tensor | None = None  # [rows] absolute position of each row
    last_rows: torch.Tensor | None = None  # [cells] the row of each cell's last position
    keys: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [n, kv_heads, head_size]
    values: dict[int, torch.Tensor] = field(default_factory=dict)


def find_attention(layer: torch.nn.Module) -> torch.nn.Module | None:
    """The vLLM ``Attention`` module of a decoder layer (the one with a paged KV cache)."""
    for module in layer.modules():
        if type(module).__name__ == "Attention" and hasattr(module, "impl") and hasattr(module, "num_kv_heads"):
            return module
    return None


def unsupported_reason(attention: torch.nn.Module | None) -> str | None:
    """Why SDPA over stored K/V would not compute what this attention layer computes (None: it would)."""
    if attention is None:
        return "a decoder layer has no vLLM Attention module"
    impl = attention.impl
    checks = {
        "a sliding window": getattr(attention, "sliding_window", None) is not None,
        "attention sinks": bool(getattr(attention, "has_sink", False)),
        "a logits soft cap": bool(getattr(impl, "logits_soft_cap", None)),
        "ALiBi": getattr(impl, "alibi_slopes", None) is not None,
        "KV shared with another layer": getattr(attention, "kv_sharing_target_layer_name", None) is not None,
        "quantized queries": getattr(attention, "query_quant", None) is not None,
        "a value head size of its own": getattr(attention, "head_size_v", attention.head_size) != attention.head_size,
        "not decoder self-attention": str(getattr(attention, "attn_type", "decoder")).lower().split(".")[-1] != "decoder",
    }
    found = [name for name, hit in checks.items() if hit]
    if not hasattr(impl, "scale"):
        found.append("no softmax scale on its implementation")
    return f"its attention has {', '.join(found)}" if found else None


def model_reason(model: torch.nn.Module, vllm_config: Any) -> str | None:
    """Why the model's layers cannot run in a call on one rank alone, whatever their attention (None: they can).
    With data parallelism a fused MoE layer exchanges every step's tokens with the other data-parallel ranks,
    which run their own engine steps meanwhile: a call on one rank would wait for them forever."""
    parallel = getattr(vllm_config, "parallel_config", None)
    if int(getattr(parallel, "data_parallel_size", 1) or 1) > 1 and any(
            "FusedMoE" in type(module).__name__ for module in model.modules()):
        return "its MoE layers exchange tokens across data-parallel ranks"
    return None


@contextlib.contextmanager
def forward_context(vllm_config: Any) -> Iterator[None]:
    """vLLM's forward context for a pass the executor drives, without attention metadata (the swapped
    attention reads none): what a layer finds by name there (a fused MoE layer's own module) is found.
    ``set_forward_context(attn_metadata, vllm_config, ...)`` takes these two first on every supported release."""
    if vllm_config is None:  # not a vLLM worker (the unit tests): nothing to set
        yield
        return
    from vllm.forward_context import set_forward_context

    with set_forward_context(None, vllm_config):
        yield


class Executor:
    """The model's decoder layers, final norm and logits, driven directly (see the module doc)."""

    def __init__(self, model: torch.nn.Module, layers: list[torch.nn.Module], vllm_config: Any = None):
        self.model: Any = model  # a vLLM model: compute_logits is the engine's
        self.layers = layers
        self.vllm_config = vllm_config
        # vLLM's Attention modules and the final norm, read by their engine attributes (num_heads, impl.scale)
        # and called as the engine calls them: Any, as the engine's types are. Used only when
        # ``unsupported`` is None, that is when every layer has one and the norm was found.
        self.attentions: list[Any] = [find_attention(layer) for layer in layers]
        self.norm: Any = _final_norm(model, layers)
        reasons = {reason for a in self.attentions if (reason := unsupported_reason(a)) is not None}
        if self.norm is None:
            reasons.add("no final norm beside the decoder layers")
        if not hasattr(model, "compute_logits"):
            reasons.add("the model has no compute_logits")
        if (reason := model_reason(model, vllm_config)) is not None:
            reasons.add(reason)
        self.unsupported = "; ".join(sorted(reasons)) or None
        self.kernel = _Kernel()

    def probe(self, hidden_size: int, dtype: torch.dtype, device: torch.device) -> str | None:
        """Run two tokens through every layer, as a sweep does (a cell from layer 0 and one at the last
        layer), and set ``unsupported`` to the failure if one happens: a layer kind this call cannot drive is
        found here, at install, not by a sweep. Returns ``unsupported``."""
        if self.unsupported is not None:
            return self.unsupported
        generator = torch.Generator().manual_seed(0)
        embedded = (torch.randn((2, hidden_size), generator=generator) * 0.02).to(device=device, dtype=dtype)
        cells = [(0, [0], embedded[:1]), (len(self.layers) - 1, [1], embedded[1:])]
        try:
            self.sweep(embedded, cells, [0], 1.0)
        except Exception as exc:  # any failure: the sweeps go by requests, and the reason says why
            self.unsupported = f"the batched executor cannot run this model's layers ({failure(exc)})"
        return self.unsupported

    # -- the swapped attention ------------------------------------------------------------------------

    def _attention(self, attention: Any) -> Callable[..., torch.Tensor]:
        heads, kv_heads, size = attention.num_heads, attention.num_kv_heads, attention.head_size
        scale = float(attention.impl.scale)
        kernel = self.kernel

        def forward(query, key, value, output_shape=None, output_dtype=None, **_):
            rows = query.shape[0]
            q = query.reshape(rows, heads, size)
            k = key.reshape(rows, kv_heads, size)
            v = value.reshape(rows, kv_heads, size)
            if kernel.record:
                kernel.keys[kernel.layer], kernel.values[kernel.layer] = k.clone(), v.clone()
                out = _sdpa(q[None], k[None], v[None], scale, causal=True)[0]
            else:
                count = int(kernel.last_rows.shape[0])
                stored_keys, stored_values = kernel.keys[kernel.layer], kernel.values[kernel.layer]
                if kernel.layer == kernel.last_layer:  # only the last rows are read: only they attend
                    out = q.new_zeros((rows, heads, size))
                    out[kernel.last_rows] = _last_row_attention(q[kernel.last_rows], stored_keys, stored_values, k, v,
                                                                kernel.cells, kernel.positions, scale)
                else:
                    all_keys = stored_keys[None].repeat(count, 1, 1, 1)
                    all_values = stored_values[None].repeat(count, 1, 1, 1)
                    all_keys[kernel.cells, kernel.positions] = k
                    all_values[kernel.cells, kernel.positions] = v
                    queries = q.new_zeros((count, all_keys.shape[1], heads, size))
                    queries[kernel.cells, kernel.positions] = q
                    out = _sdpa(queries, all_keys, all_values, scale, causal=True)[kernel.cells, kernel.positions]
            out = out.to(output_dtype or query.dtype)
            return out.reshape(output_shape if output_shape is not None else (rows, heads * size))

        return forward

    def _swap(self) -> list[tuple[Any, Any]]:
        swapped = []
        for attention in self.attentions:
            swapped.append((attention, attention.__dict__.get("forward")))
            attention.forward = self._attention(attention)
        return swapped

    @staticmethod
    def _restore(swapped: list[tuple[Any, Any]]) -> None:
        for attention, before in swapped:
            if before is None:
                attention.__dict__.pop("forward", None)
            else:
                attention.forward = before

    def _run_layers(self, first: int, positions: torch.Tensor, hidden: torch.Tensor, residual: torch.Tensor | None,
                    keep: list[torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        for index in range(first, len(self.layers)):
            if keep is not None:
                keep.append(hidden if residual is None else hidden + residual)
            self.kernel.layer = index
            hidden, residual = self.layers[index](positions, hidden, residual)
        if residual is None:  # no layer ran from layer 0: the stream is all in `hidden`
            residual = torch.zeros_like(hidden)
        return hidden, residual

    def _logprobs(self, hidden: torch.Tensor, residual: torch.Tensor, scored: list[int]) -> torch.Tensor | None:
        normed = self.norm(hidden, residual)
        normed = normed[0] if isinstance(normed, tuple) else normed
        logits = self.model.compute_logits(normed)
        if logits is None:  # a tensor-parallel rank other than the first: the logits are gathered on rank 0
            return None
        return torch.log_softmax(logits.to(torch.float32), dim=-1)[:, scored]

    # -- the sweep ----------------------------------------------------------------------------------------

    def sweep(self, embedded: torch.Tensor, cells: list[tuple[int, list[int], torch.Tensor]], scored: list[int],
              alpha: float, max_elements: int = MAX_CHUNK_ELEMENTS) -> dict[str, Any]:
        """``embedded``: the corrupt run's input to layer 0 (noise included), ``[n, hidden]``. ``cells``:
        ``(first layer to run, positions, replacement rows [len(positions), hidden])``; a first layer
        equal to the layer count means the patch is on the last layer's output. Returns the corrupt
        run's and each cell's logprobs of ``scored`` at the last position (lists; None off rank 0)."""
        swapped = self._swap()
        try:
            with forward_context(self.vllm_config):
                return self._sweep(embedded, cells, scored, alpha, max_elements)
        finally:
            self._restore(swapped)
            self.kernel.keys, self.kernel.values = {}, {}
            self.kernel.cells = self.kernel.positions = self.kernel.last_rows = None

    def _sweep(self, embedded: torch.Tensor, cells: list[tuple[int, list[int], torch.Tensor]], scored: list[int],
               alpha: float, max_elements: int) -> dict[str, Any]:
        n = embedded.shape[0]
        device = embedded.device
        kernel = self.kernel
        kernel.keys, kernel.values = {}, {}
        kernel.record, kernel.last_layer = True, len(self.layers) - 1
        streams: list[torch.Tensor] = []
        hidden, residual = self._run_layers(0, torch.arange(n, device=device), embedded, None, streams)
        streams.append(hidden + residual)
        corrupt = self._logprobs(hidden[-1:], residual[-1:], scored)
        kernel.record = False

        results: list[Any] = [None] * len(cells)
        width = max(a.num_heads * a.head_size for a in self.attentions)
        max_cells = max(1, max_elements // (n * width))  # each cell's queries are padded to n rows
        order = sorted(range(len(cells)), key=lambda c: cells[c][0])
        chunk: list[int] = []
        for position_in_order, c in enumerate(order):
            first, positions, _ = cells[c]
            chunk.append(c)
            following = order[position_in_order + 1] if position_in_order + 1 < len(order) else None
            if following is None or cells[following][0] != first or len(chunk) >= max_cells:
                self._run_chunk(chunk, cells, streams, n, scored, alpha, results)
                chunk = []
        return {"corrupt": None if corrupt is None else corrupt[0].tolist(), "cells": results,
                "recomputed_rows": sum(self.recomputed_rows(f, p, n) for f, p, _ in cells)}

    def recomputed_rows(self, first: int, positions: list[int], n: int) -> int:
        """How many (layer, position) rows a cell runs through a decoder layer (see ``_run_chunk``)."""
        if first >= len(self.layers):
            return 0
        if first == len(self.layers) - 1:
            return len(set(positions) | {n - 1})
        return (len(self.layers) - first) * (n - min(positions))

    def _run_chunk(self, chunk: list[int], cells: list, streams: list[torch.Tensor], n: int, scored: list[int],
                   alpha: float, results: list[Any]) -> None:
        first = cells[chunk[0]][0]
        device = streams[0].device
        parts, positions, owners, last = [], [], [], []
        offset = 0
        only_last_layer = first >= len(self.layers) - 1
        for number, c in enumerate(chunk):
            _, cell_positions, source = cells[c]
            if only_last_layer:
                # the last layer alone (or none): its output is read at the last position only, and only the
                # patched rows' K/V differ from the corrupt run's, so those rows and the last one suffice
                wanted = torch.tensor(sorted(set(cell_positions) | {n - 1}), dtype=torch.long, device=device)
            else:  # every row from the first patched one on: each layer changes them all for the next
                wanted = torch.arange(min(cell_positions), n, device=device)
            rows = streams[first][wanted]
            index = torch.searchsorted(wanted, torch.tensor(cell_positions, dtype=torch.long, device=device))
            source = source.to(device=device, dtype=rows.dtype)
            rows[index] = source if alpha == 1.0 else (1.0 - alpha) * rows[index] + alpha * source
            parts.append(rows)
            positions.append(wanted)
            owners.append(torch.full((len(wanted),), number, dtype=torch.long, device=device))
            offset += len(wanted)
            last.append(offset - 1)
        hidden = torch.cat(parts)
        # the engine writes a patched row as (hidden = value, residual = 0): the next fused add gives the value
        residual = None if first == 0 else torch.zeros_like(hidden)
        kernel = self.kernel
        kernel.positions, kernel.cells = torch.cat(positions), torch.cat(owners)
        kernel.last_rows = torch.tensor(last, dtype=torch.long, device=device)
        hidden, residual = self._run_layers(first, kernel.positions, hidden, residual)
        logprobs = self._logprobs(hidden[kernel.last_rows], residual[kernel.last_rows], scored)
        for row, c in enumerate(chunk):
            results[c] = None if logprobs is None else logprobs[row].tolist()


def probed_executor(model: torch.nn.Module, layers: list[torch.nn.Module], runner: Any) -> Executor:
    """The executor of a worker's model, probed (``Executor.probe``) in the model's dtype, on its device. The
    caller keeps its own hooks out of the way meanwhile."""
    executor = Executor(model, layers, getattr(runner, "vllm_config", None))
    device = next(model.parameters()).device
    with torch.inference_mode():
        executor.probe(int(runner.model_config.get_hidden_size()), runner.model_config.dtype, device)
    return executor


def failure(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message."""
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    return f"{type(exc).__name__}: {first}"


def _last_row_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, new_keys: torch.Tensor,
                        new_values: torch.Tensor, cells: torch.Tensor, positions: torch.Tensor, scale: float) -> torch.Tensor:
    """Each cell's last query (``q[c]``, ``[heads, size]``, at the last position: it sees every key) over
    the corrupt run's keys and values ``[n, kv_heads, size]``, with the batch rows' own ``new_keys`` and
    ``new_values`` (row r belongs to cell ``cells[r]`` at ``positions[r]``) in place of the corrupt ones.
    Written as the shared keys' scores with the cells' own rows swapped in, so no per-cell copy of the
    keys is made."""
    count, heads, size = q.shape
    kv_heads = keys.shape[1]
    grouped = q.reshape(count, kv_heads, heads // kv_heads, size)
    scores = torch.einsum("cjgd,njd->cjgn", grouped, keys) * scale
    own = torch.einsum("rjgd,rjd->rjg", grouped[cells], new_keys) * scale
    scores[cells, :, :, positions] = own
    wide = scores.float() if scores.element_size() < 4 else scores  # half precision: the softmax in fp32
    probs = torch.softmax(wide, dim=-1).to(q.dtype)
    out = torch.einsum("cjgn,njd->cjgd", probs, values)
    # the rows' own values in place of the corrupt ones: add p * (own - corrupt) for each
    change = probs[cells, :, :, positions][..., None] * (new_values - values[positions])[:, :, None, :]
    out.index_add_(0, cells, change)
    return out.reshape(count, heads, size)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, causal: bool) -> torch.Tensor:
    """Attention over ``[batch, rows, heads, size]`` queries and ``[batch, keys, kv_heads, size]`` keys and
    values (grouped-query heads repeated); causal: row i sees keys 0..i."""
    groups = q.shape[2] // k.shape[2]
    keys, values = k.transpose(1, 2), v.transpose(1, 2)
    if groups > 1:
        keys, values = keys.repeat_interleave(groups, dim=1), values.repeat_interleave(groups, dim=1)
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), keys, values, is_causal=causal, scale=scale)
    return out.transpose(1, 2)


def _final_norm(model: torch.nn.Module, layers: list[torch.nn.Module]) -> torch.nn.Module | None:
    """The norm applied after the last decoder layer: ``norm`` beside the ``layers`` list."""
    for module in model.modules():
        children = getattr(module, "layers", None)
        if isinstance(children, torch.nn.ModuleList) and len(children) and children[0] is layers[0]:
            norm = getattr(module, "norm", None)
            return norm if isinstance(norm, torch.nn.Module) else None
    return None
