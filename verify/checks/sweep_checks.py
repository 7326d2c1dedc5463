"""The `toolkit verify` check ``patch-sweep`` (needs the vLLM patch-sweep patch, with its routes on):
/v1/patch_sweep driven through the PatchStudy client."""

from __future__ import annotations

from typing import Any

from toolkit.clients.patch_study import PatchStudy, PatchStudyError, Span
from toolkit.verify.checks.check_types import Check, CheckFailed, CheckSkipped, Target, first_difference, ids_evidence
from toolkit.verify.client import ServerGone


# Word pairs for the patch-sweep check: the first whose two prompts tokenize to the same length.
SWEEP_PAIRS = [("cat", "dog"), ("red", "blue"), ("one", "two"), ("1", "2"), ("a", "b")]
SWEEP_TEMPLATE = "The {} sat on the mat and looked at the door"
# Two forward passes of the same request in different batches: fp32 on CPU agrees far closer than this.
SWEEP_TOLERANCE = 1e-3


def _sweep_prompts(tokenizer: Any) -> tuple[str, str, list[int], str, int]:
    """A clean and a corrupt prompt of the same token length, the corrupt prompt's ids, the corrupt word,
    and the first position where the two prompts' ids differ."""
    for clean_word, corrupt_word in SWEEP_PAIRS:
        clean, corrupt = SWEEP_TEMPLATE.format(clean_word), SWEEP_TEMPLATE.format(corrupt_word)
        a, b = tokenizer.encode(clean), tokenizer.encode(corrupt)
        differs_at = first_difference(a, b)
        if len(a) == len(b) and differs_at is not None:
            return clean, corrupt, list(b), corrupt_word, differs_at
    raise CheckSkipped("no prompt pair of equal token length for this tokenizer")


def _cells(grid: list[list[float | None]]) -> list[list[float]] | None:
    """The grid's values when every cell was run; None when one was skipped."""
    rows = [[value for value in row if value is not None] for row in grid]
    return rows if all(len(a) == len(b) for a, b in zip(rows, grid)) else None


def check_patch_sweep(target: Target) -> str:
    """/v1/patch_sweep smoke test through the PatchStudy client, with answers known without a reference
    model: capture a clean run, sweep every layer at [the corrupt word (a span), position 0, the last
    position] streamed and not. Patching the last layer's output at the last position gives exactly the
    clean run's logits; patching a position before the prompts differ changes nothing (the same prefix).
    A span that is not in the prompt is a 400 and the server stays up; the run is deleted afterwards."""
    import urllib.error
    import uuid

    study = PatchStudy(target.base_url, timeout=300)
    try:
        try:
            study.runs()
        except PatchStudyError as exc:
            if exc.status == 404:
                raise CheckSkipped("patch-sweep is applied but this server runs without TOOLKIT_ENABLE_PATCHING=1")
            raise CheckFailed(f"listing runs: {exc}") from None
        clean, corrupt, corrupt_ids, word, differs_at = _sweep_prompts(target.tokenizer)
        last = len(corrupt_ids) - 1
        name = f"toolkit-verify-{uuid.uuid4().hex[:8]}"
        try:
            study.capture(clean, name, hooks=["post_block"])
        except PatchStudyError as exc:
            raise CheckFailed(f"capture: {exc}") from None
        try:
            sweep: dict[str, Any] = dict(run=name, layers="all", positions=[Span(word), 0, last], hook="post_block",
                         answer_token_id=corrupt_ids[-1], foil_token_id=corrupt_ids[0], metric="logit_diff")
            streamed_cells: list[tuple[int, int]] = []
            try:
                plain = study.sweep_layers_positions(corrupt, **sweep)
                summary = study.sweep_layers_positions(
                    corrupt, **sweep, on_cell=lambda layer, position, value: streamed_cells.append((layer, position)))
            except PatchStudyError as exc:
                raise CheckFailed(f"sweep: {exc}") from None
            if plain.raw.get("prompt_token_ids") != corrupt_ids:
                raise CheckFailed("the sweep tokenized the prompt differently from the model's tokenizer",
                                  **ids_evidence("server", plain.raw.get("prompt_token_ids") or [], "local", corrupt_ids))
            positions, layers = plain.positions, plain.layers
            grid, streamed = _cells(plain.grid), _cells(summary.grid)
            span = [p for p in positions if p not in (0, last)]
            if not span or differs_at not in span or positions[-2:] != [0, last] or positions[:len(span)] != span:
                raise CheckFailed(f"positions {positions}: expected the tokens of {word!r} (from {differs_at}), 0, {last}")
            if grid is None or len(grid) != len(layers) or any(len(row) != len(positions) for row in grid):
                raise CheckFailed("the grid is not layers x positions with every cell run", grid=plain.grid)
            if streamed is None:
                raise CheckFailed("the streamed summary has cells that were not run", stream=summary.grid)
            if len(streamed_cells) != len(layers) * len(positions):
                raise CheckFailed(f"stream: {len(streamed_cells)} cell events for {len(layers) * len(positions)} cells")
            stream_gap = max(abs(a - b) for ra, rb in zip(grid, streamed) for a, b in zip(ra, rb))
            if summary.positions != positions or stream_gap > SWEEP_TOLERANCE:
                raise CheckFailed(f"the streamed summary differs from the non-streamed response (max {stream_gap:.2e})",
                                  stream=summary.grid, nonstream=grid)
            if not plain.baselines:
                raise CheckFailed("the sweep's response has no baselines (the clean and corrupt runs' values)")
            clean_value = plain.baselines["clean"]["logit_diff"]
            corrupt_value = plain.baselines["corrupt"]["logit_diff"]
            restored = grid[-1][-1]
            if abs(restored - clean_value) > SWEEP_TOLERANCE:
                raise CheckFailed(f"patching layer {layers[-1]} at the last position gives {restored:.6f}, not the clean "
                                  f"run's {clean_value:.6f}", grid=grid, baselines=plain.baselines)
            if differs_at > 0:
                unchanged = [row[-2] for row in grid]
                if max(abs(v - corrupt_value) for v in unchanged) > SWEEP_TOLERANCE:
                    raise CheckFailed(f"patching position 0 (the same in both prompts) changed the answer: {unchanged} "
                                      f"vs the corrupt run's {corrupt_value:.6f}", grid=grid)
            missing = "zebra-not-in-prompt"
            try:
                study.sweep_layers_positions(corrupt, **{**sweep, "positions": [Span(missing)]})
                refusal = None
            except PatchStudyError as exc:
                refusal = exc
            if refusal is None or refusal.status != 400 or missing not in str(refusal):
                raise CheckFailed(f"a span not in the prompt: expected a 400 naming it, got "
                                  f"{'HTTP 200' if refusal is None else f'HTTP {refusal.status}: {refusal}'}")
        finally:
            study.delete(name)
        if name in [run["name"] for run in study.runs()]:
            raise CheckFailed(f"run {name!r} is still listed after DELETE")
    except (urllib.error.URLError, ConnectionError, TimeoutError) as exc:
        raise ServerGone(str(exc)) from exc
    return (f"{len(layers)} layers x {len(positions)} positions (span {word!r} -> {span}), stream = non-stream; "
            f"last-layer patch restores the clean answer ({restored:.4f} vs {clean_value:.4f}); bad span: 400")


CHECKS = [
    Check("patch-sweep", "/v1/patch_sweep: a small grid, stream = non-stream, known cells, a clean 400",
          {"vllm": "patch-sweep"}, check_patch_sweep,
          env=(("TOOLKIT_ENABLE_PATCHING", "1"),)),  # the sweep routes are added only when enabled
]
