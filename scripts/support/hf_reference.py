"""The reference: activation patching with Hugging Face transformers and forward hooks, one forward
pass per cell (the TransformerLens way), on the same weights in float32.

Used by the server tests (the grid must equal this to 1e-4) and by scripts/bench_patch_sweep.py (the
sequential loop the server-side sweep is timed against). Written from the model's definition, not
from the patch's code: HF's decoder layer adds the residual itself, so

* ``pre_attn`` is the layer's input (a forward pre-hook replaces it);
* ``post_attn`` is ``input + attention output`` (a hook on ``self_attn`` rewrites its output so that
  the sum is the patched value);
* ``post_block`` is the layer's output (a forward hook replaces it).

With sandwich norms (Gemma 2 and 3: ``post_attention_layernorm`` normalizes attention's output before it is
added, ``post_feedforward_layernorm`` the MLP's) what attention and the MLP add to the stream are those
norms' outputs, so the hooks sit on them instead of ``self_attn`` and ``mlp``.

Noise corruption (ROME's causal tracing) adds ``scale *`` row i of a standard normal [count, hidden]
draw from ``torch.Generator().manual_seed(seed)`` (float32) to the embedding of the noise's i-th
position: a forward hook on the embedding module; the default scale is 3x the std of the embedding matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import torch

HOOKS = ("pre_attn", "post_attn", "post_block")


@dataclass
class Patch:
    hook: str
    layer: int
    positions: Sequence[int]
    source: torch.Tensor  # [source tokens, hidden]: the clean run's stream at (hook, layer)
    alpha: float = 1.0

    def mix(self, own: torch.Tensor) -> torch.Tensor:
        """``own`` ([tokens, hidden]) with the patched positions replaced or interpolated."""
        out = own.clone()
        index = torch.tensor(list(self.positions), dtype=torch.long)
        source = self.source[index]
        out[index] = source if self.alpha == 1.0 else (1.0 - self.alpha) * own[index] + self.alpha * source
        return out


@dataclass
class Noise:
    positions: Sequence[int]
    seed: int
    scale: float

    def rows(self, width: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed)
        return torch.randn((len(self.positions), width), generator=generator, dtype=torch.float32) * self.scale


@dataclass
class Steer:
    """Add ``scale * vector`` to the stream at (hook, layer) at the absolute positions ``selects`` keeps
    (``selects(position, prompt_len) -> bool``)."""

    layer: int
    hook: str
    vector: torch.Tensor
    selects: Any
    prompt_len: int
    scale: float = 1.0

    def add(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` ([1, tokens, hidden]) plus the vector at the selected positions."""
        keep = torch.tensor([bool(self.selects(p, self.prompt_len)) for p in range(tensor.shape[1])])
        return tensor + keep[None, :, None].to(tensor.dtype) * (self.scale * self.vector).to(tensor.dtype)


class Reference:
    def __init__(self, model_dir: str):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(0)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32,
                                                          attn_implementation="eager").eval()
        self.layers = list(self.model.model.layers)

    def embedding_std(self) -> float:
        return float(self.model.get_input_embeddings().weight.detach().float().std())

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=True)

    def token(self, text: str) -> int:
        (token,) = self.tokenizer.encode(text, add_special_tokens=False)
        return token

    @torch.no_grad()
    def run(self, ids: Sequence[int], patch: Patch | None = None, capture: bool = False, noise: Noise | None = None,
            steer: Sequence[Steer] = (), every_position: bool = False
            ) -> tuple[torch.Tensor, dict[tuple[str, int], torch.Tensor]]:
        """Next-token logprobs after ``ids`` ([vocab], float32) and, with ``capture``, the stream at every
        (hook, layer) as [tokens, hidden], plus each layer's attention and MLP outputs (``attn_out``,
        ``mlp_out``)."""
        captured: dict[tuple[str, int], torch.Tensor] = {}
        inputs: dict[int, torch.Tensor] = {}
        handles = []

        def wants(hook: str, layer: int) -> bool:
            return patch is not None and patch.hook == hook and patch.layer == layer

        def steered(hook: str, layer: int, tensor: torch.Tensor) -> torch.Tensor:
            for edit in steer:
                if edit.hook == hook and edit.layer == layer:
                    tensor = edit.add(tensor)
            return tensor

        def noised(module, args, output):
            out = output.clone()
            out[0, list(noise.positions)] += noise.rows(out.shape[-1]).to(out.dtype)
            return out

        if noise is not None:
            handles.append(self.model.get_input_embeddings().register_forward_hook(noised))

        for index, layer in enumerate(self.layers):
            def pre(module, args, kwargs, index=index):
                hidden = args[0] if args else kwargs["hidden_states"]
                if wants("pre_attn", index):
                    hidden = patch.mix(hidden[0])[None]
                hidden = steered("pre_attn", index, hidden)
                args, kwargs = ((hidden, *args[1:]), kwargs) if args else (args, {**kwargs, "hidden_states": hidden})
                inputs[index] = hidden
                if capture:
                    captured[("pre_attn", index)] = hidden[0].clone()
                return args, kwargs

            def attn(module, args, output, index=index):
                attn_out = output[0] if isinstance(output, tuple) else output
                stream = inputs[index] + attn_out
                if wants("post_attn", index):
                    attn_out = patch.mix(stream[0])[None] - inputs[index]
                    stream = inputs[index] + attn_out
                attn_out = steered("post_attn", index, attn_out)
                stream = inputs[index] + attn_out
                if capture:
                    captured[("post_attn", index)] = stream[0].clone()
                    captured[("attn_out", index)] = attn_out[0].clone()
                return (attn_out, *output[1:]) if isinstance(output, tuple) else attn_out

            def post(module, args, kwargs, output, index=index):
                hidden = output[0] if isinstance(output, tuple) else output
                if wants("post_block", index):
                    hidden = patch.mix(hidden[0])[None]
                hidden = steered("post_block", index, hidden)
                if capture:
                    captured[("post_block", index)] = hidden[0].clone()
                return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

            def mlp(module, args, output, index=index):
                if capture:  # a MoE block may answer (output, router logits)
                    tensor = output[0] if isinstance(output, tuple) else output
                    captured[("mlp_out", index)] = tensor.reshape(-1, tensor.shape[-1]).clone()

            sandwich = hasattr(layer, "pre_feedforward_layernorm")
            attention = layer.post_attention_layernorm if sandwich else layer.self_attn
            feedforward = layer.post_feedforward_layernorm if sandwich else layer.mlp
            handles += [layer.register_forward_pre_hook(pre, with_kwargs=True),
                        attention.register_forward_hook(attn), feedforward.register_forward_hook(mlp),
                        layer.register_forward_hook(post, with_kwargs=True)]
        try:
            logits = self.model(torch.tensor([list(ids)])).logits[0].float()
            logits = logits if every_position else logits[-1]
        finally:
            for handle in handles:
                handle.remove()
        return torch.log_softmax(logits, dim=-1), captured


def steered_logprobs(ref: Reference, prompt_ids: Sequence[int], generated: Sequence[int], steer: Sequence[Steer]
                     ) -> list[float]:
    """The logprob of each generated token given everything before it, steered (one full forward pass
    over prompt + generated: steering earlier positions changes what later ones attend to, exactly as
    cached steered KV does in the engine)."""
    ids = list(prompt_ids) + list(generated)
    logprobs = ref.run(ids[:-1], steer=steer, every_position=True)[0]
    return [float(logprobs[len(prompt_ids) - 1 + i, token]) for i, token in enumerate(generated)]


def steered_greedy(ref: Reference, prompt_ids: Sequence[int], steps: int, steer: Sequence[Steer]) -> list[int]:
    """Greedy tokens under steering, one full forward pass per token."""
    ids = list(prompt_ids)
    for _ in range(steps):
        ids.append(int(ref.run(ids, steer=steer)[0].argmax()))
    return ids[len(prompt_ids):]


def measures(logprobs: torch.Tensor, answer: int, foil: int | None) -> dict[str, float]:
    out = {"logprob": float(logprobs[answer])}
    if foil is not None:
        out["logit_diff"] = float(logprobs[answer] - logprobs[foil])
    return out


def grid(ref: Reference, clean_ids: Sequence[int], corrupt_ids: Sequence[int], *, hook: str, layers: Sequence[int],
         positions: Sequence[Any], answer: int, foil: int | None, metric: str, alpha: float = 1.0,
         noise: Noise | None = None) -> dict[str, Any]:
    """The sweep, one forward pass per cell: the grid and both baselines, shaped like the server's answer.
    A position may be a list (a span cell: all patched in one pass); ``noise`` corrupts every corrupt run."""
    clean_lp, acts = ref.run(clean_ids, capture=True)
    clean, corrupt = measures(clean_lp, answer, foil), measures(ref.run(corrupt_ids, noise=noise)[0], answer, foil)
    base = "logit_diff" if foil is not None else "logprob"
    rows = []
    for layer in layers:
        row: list[float | None] = []
        for position in positions:
            column = list(position) if isinstance(position, list) else [position]
            if max(column) >= len(clean_ids):
                row.append(None)
                continue
            patch = Patch(hook, layer, column, acts[(hook, layer)], alpha)
            cell = measures(ref.run(corrupt_ids, patch, noise=noise)[0], answer, foil)
            if metric == "recovered":
                row.append((cell[base] - corrupt[base]) / (clean[base] - corrupt[base]))
            else:
                row.append(cell[metric])
        rows.append(row)
    return {"grid": rows, "baselines": {"clean": clean, "corrupt": corrupt}}
