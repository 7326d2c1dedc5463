"""The batched sweep's attention pieces against plain causal attention over each cell's own keys.

The server tests (test_server.py) run the whole executor inside real vLLM workers against the Hugging
Face reference; these check the two attention paths on random inputs of several shapes, GQA included,
where a wrong index would show at once.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from toolkit.patches.vllm.patch_sweep.batched import _last_row_attention, _sdpa, unsupported_reason


def naive(q, keys, values, scale):
    """Causal attention of queries at the last ``len(q)`` positions over ``keys``: ``[rows, heads, size]``."""
    heads, kv_heads = q.shape[1], keys.shape[1]
    keys = keys.repeat_interleave(heads // kv_heads, dim=1)
    values = values.repeat_interleave(heads // kv_heads, dim=1)
    n, rows = keys.shape[0], q.shape[0]
    scores = torch.einsum("rhd,nhd->hrn", q, keys) * scale
    mask = torch.arange(n)[None, :] <= torch.arange(n - rows, n)[:, None]
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.einsum("hrn,nhd->rhd", scores.softmax(-1), values)


def cells_of(n: int, count: int, generator: torch.Generator) -> list[list[int]]:
    cells = []
    for _ in range(count):
        size = int(torch.randint(1, 4, (1,), generator=generator))
        cells.append(sorted({int(p) for p in torch.randint(0, n, (size,), generator=generator)} | {n - 1}))
    return cells


@pytest.mark.parametrize("n,heads,kv_heads,size,count", [(7, 4, 2, 8, 5), (33, 8, 8, 16, 9), (64, 6, 2, 32, 3), (1, 2, 1, 4, 2)])
def test_last_row_attention_equals_attention_over_each_cells_own_keys(n, heads, kv_heads, size, count):
    generator = torch.Generator().manual_seed(n * 31 + heads)
    keys = torch.randn(n, kv_heads, size, generator=generator, dtype=torch.float64)
    values = torch.randn(n, kv_heads, size, generator=generator, dtype=torch.float64)
    cells = cells_of(n, count, generator)
    rows = [(c, p) for c, positions in enumerate(cells) for p in positions]
    owners = torch.tensor([c for c, _ in rows])
    positions = torch.tensor([p for _, p in rows])
    new_keys = torch.randn(len(rows), kv_heads, size, generator=generator, dtype=torch.float64)
    new_values = torch.randn(len(rows), kv_heads, size, generator=generator, dtype=torch.float64)
    q = torch.randn(count, heads, size, generator=generator, dtype=torch.float64)
    scale = size ** -0.5
    got = _last_row_attention(q, keys, values, new_keys, new_values, owners, positions, scale)
    for c in range(count):
        own_keys, own_values = keys.clone(), values.clone()
        for r, (owner, p) in enumerate(rows):
            if owner == c:
                own_keys[p], own_values[p] = new_keys[r], new_values[r]
        want = naive(q[c : c + 1], own_keys, own_values, scale)[0]
        torch.testing.assert_close(got[c], want, rtol=1e-10, atol=1e-10)
    # a cell's own rows matter: the answer without them differs
    assert not torch.allclose(got[0], naive(q[:1], keys, values, scale)[0])


@pytest.mark.parametrize("batch,rows,heads,kv_heads,size", [(3, 9, 4, 2, 8), (1, 16, 2, 2, 32), (5, 1, 8, 1, 4)])
def test_padded_causal_sdpa_equals_naive_per_cell(batch, rows, heads, kv_heads, size):
    generator = torch.Generator().manual_seed(rows * 7 + batch)
    q = torch.randn(batch, rows, heads, size, generator=generator)
    k = torch.randn(batch, rows, kv_heads, size, generator=generator)
    v = torch.randn(batch, rows, kv_heads, size, generator=generator)
    got = _sdpa(q, k, v, 0.3, causal=True)
    for b in range(batch):
        torch.testing.assert_close(got[b], naive(q[b], k[b], v[b], 0.3), rtol=1e-5, atol=1e-5)


def attention(**fields):
    impl = SimpleNamespace(scale=0.125, logits_soft_cap=fields.pop("logits_soft_cap", None),
                           alibi_slopes=fields.pop("alibi_slopes", None))
    base = dict(impl=impl, num_heads=4, num_kv_heads=2, head_size=32, head_size_v=32, sliding_window=None,
                has_sink=False, kv_sharing_target_layer_name=None, query_quant=None, attn_type="decoder")
    return SimpleNamespace(**{**base, **fields})


@pytest.mark.parametrize("fields,reason", [
    ({"sliding_window": 4096}, "a sliding window"),
    ({"has_sink": True}, "attention sinks"),
    ({"logits_soft_cap": 30.0}, "a logits soft cap"),
    ({"alibi_slopes": [0.5]}, "ALiBi"),
    ({"kv_sharing_target_layer_name": "layers.0.attn"}, "KV shared with another layer"),
    ({"query_quant": object()}, "quantized queries"),
    ({"head_size_v": 16}, "a value head size of its own"),
    ({"attn_type": "encoder_only"}, "not decoder self-attention"),
])
def test_attention_the_executor_would_compute_differently_sends_the_sweep_to_requests(fields, reason):
    assert unsupported_reason(attention()) is None
    assert unsupported_reason(attention(**fields)) == f"its attention has {reason}"
    assert unsupported_reason(None) == "a decoder layer has no vLLM Attention module"


class Attention(torch.nn.Module):
    """Named as vLLM's attention layer, with what the executor reads of it; it is swapped out in a sweep."""

    def __init__(self):
        super().__init__()
        self.impl = SimpleNamespace(scale=0.5)
        self.num_heads = self.num_kv_heads = 1
        self.head_size = self.head_size_v = 4


class Layer(torch.nn.Module):
    """A decoder layer as vLLM's: (positions, hidden, residual) -> (hidden, residual), its attention on the
    rows; ``needs`` a condition the executor's call cannot meet (as vLLM's fused MoE needs its forward context)."""

    def __init__(self, needs: bool):
        super().__init__()
        self.self_attn = Attention()
        self.needs = needs

    def forward(self, positions, hidden, residual):
        if self.needs:
            raise AssertionError("Forward context is not set.\nPlease use `set_forward_context`")
        hidden = hidden if residual is None else hidden + residual
        return self.self_attn(hidden, hidden, hidden), torch.zeros_like(hidden)


class Norm(torch.nn.Module):
    def forward(self, hidden, residual):  # vLLM's fused add and norm, without the norm
        return hidden + residual


class Model(torch.nn.Module):
    def __init__(self, needs: bool):
        super().__init__()
        self.layers = torch.nn.ModuleList([Layer(needs), Layer(needs)])
        self.norm = Norm()

    def compute_logits(self, hidden):
        return hidden


@pytest.mark.parametrize("needs", [False, True])
def test_a_layer_the_executor_cannot_drive_is_found_by_the_probe_before_any_sweep(needs):
    from toolkit.patches.vllm.patch_sweep.batched import Executor

    model = Model(needs)
    executor = Executor(model, list(model.layers))
    assert executor.unsupported is None  # the attention alone looks fine: only running the layers tells
    reason = executor.probe(4, torch.float32, torch.device("cpu"))
    if needs:
        assert reason == executor.unsupported == ("the batched executor cannot run this model's layers "
                                                  "(AssertionError: Forward context is not set.)")
    else:
        assert reason is None
        answer = executor.sweep(torch.randn(3, 4), [(0, [1], torch.randn(1, 4)), (1, [2], torch.randn(1, 4))], [0, 1], 1.0)
        assert len(answer["corrupt"]) == 2 and all(len(cell) == 2 for cell in answer["cells"])
    assert "forward" not in model.layers[0].self_attn.__dict__  # the swapped attention is put back either way
