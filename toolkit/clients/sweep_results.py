"""What a PatchStudy call gives back (toolkit.clients.patch_study): a captured run, activations, a sweep's
result with its tables and heatmap, and the one error type. Apart from the client so that each module holds
one job."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

Cell = tuple[int, int, float]  # (layer, position, value)


class PatchStudyError(ValueError):
    """The server refused a request (its message says what to change; ``status`` is the HTTP status),
    or the study was misused (``status`` None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class CapturedRun:
    """A prompt's activations stored on the server under ``name``."""

    name: str
    prompt: str
    num_tokens: int
    captured: dict[str, list[int]]
    prompt_token_ids: list[int]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "CapturedRun":
        return cls(data["name"], data.get("prompt", ""), int(data["num_tokens"]), dict(data.get("captured", {})),
                   list(data.get("prompt_token_ids", [])))


@dataclass
class Activations:
    """Activations returned by ``/v1/activations``: ``arrays[(hook, layer)]`` is a numpy array
    [positions, hidden] in the model's dtype (bfloat16 widened to float32)."""

    arrays: dict[tuple[str, int], Any]
    prompt_token_ids: list[int]
    positions: list[int]
    position_tokens: list[str] = field(default_factory=list)

    def __getitem__(self, key: tuple[str, int]) -> Any:
        return self.arrays[key]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "Activations":
        import base64

        from toolkit.patches.vllm.patch_sweep.arrays import to_numpy

        arrays = {(a["hook"], int(a["layer"])): to_numpy(a["dtype"], a["shape"], base64.b64decode(a["data"]))
                  for a in data["activations"]}
        return cls(arrays, list(data["prompt_token_ids"]), list(data["positions"]), list(data["position_tokens"]))

    @classmethod
    def from_safetensors(cls, blob: bytes) -> "Activations":
        from toolkit.patches.vllm.patch_sweep.arrays import decode_safetensors, to_numpy

        found, metadata = decode_safetensors(blob)
        arrays = {}
        for name, array in found.items():
            hook, layer = name.rsplit(".", 1)
            arrays[(hook, int(layer))] = to_numpy(array["dtype"], array["shape"], array["data"])
        info = {key: json.loads(value) for key, value in metadata.items()}
        return cls(arrays, info["prompt_token_ids"], info["positions"], info.get("position_tokens", []))


@dataclass
class SweepResult:
    """A layers x positions grid of the metric (``None`` where a cell was skipped)."""

    grid: list[list[float | None]]
    layers: list[int]
    positions: list[int]
    position_tokens: list[str] = field(default_factory=list)
    metric: str = ""
    hook: str = ""
    baselines: dict[str, dict[str, float]] | None = None
    skipped: list[dict[str, Any]] = field(default_factory=list)
    noise_floor: dict[str, Any] | None = None
    source_run: str = ""
    auto_captured: bool = False
    captured_source_run: str | None = None
    prefix_reuse: dict[str, Any] | None = None  # {"enabled", "cell_prompt_tokens", "cached_tokens", ...}
    executor: str = ""  # how the server ran the cells: "batched" (one worker call) or "requests"
    executor_reason: str | None = None  # why by requests (None: batched)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_response(cls, data: dict[str, Any]) -> "SweepResult":
        return cls(grid=[list(row) for row in data["grid"]], layers=list(data["layers"]),
                   positions=list(data["positions"]), position_tokens=list(data.get("position_tokens") or []),
                   metric=data.get("metric", ""), hook=data.get("hook", ""), baselines=data.get("baselines"),
                   skipped=list(data.get("skipped") or []), noise_floor=data.get("noise_floor"),
                   source_run=data.get("source_run", ""), auto_captured=bool(data.get("auto_captured")),
                   captured_source_run=data.get("captured_source_run"), prefix_reuse=data.get("prefix_reuse"),
                   executor=data.get("executor", ""), executor_reason=data.get("executor_reason"), raw=data)

    def cells(self) -> Iterator[Cell]:
        for layer, row in zip(self.layers, self.grid):
            for position, value in zip(self.positions, row):
                if value is not None:
                    yield layer, position, value

    def top(self, k: int = 5) -> list[Cell]:
        """The ``k`` highest cells, highest first (grid order breaks ties)."""
        return sorted(self.cells(), key=lambda cell: -cell[2])[:k]

    def argmax_cell(self) -> Cell | None:
        best = self.top(1)
        return best[0] if best else None

    def to_numpy(self):
        """The grid as a float array [layers, positions], NaN where skipped."""
        import numpy as np

        return np.array([[math.nan if v is None else v for v in row] for row in self.grid], dtype=float)

    # ---------------------------------------------------------------------------------------------
    # heatmaps

    def _labels(self) -> list[str]:
        tokens = self.position_tokens or [""] * len(self.positions)
        return [f"{p}:{t!r}"[:14] for p, t in zip(self.positions, tokens)]

    def plot(self, path: str | Path, title: str | None = None) -> Path:
        """Write the heatmap as a PNG with matplotlib (the ``plot`` extra): layers down, positions (with
        their tokens) across, skipped cells blank."""
        from toolkit.base.extras import require

        require("plot", ("matplotlib",), "PatchStudy's plot()")
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        path = Path(path)
        figure, axes = plt.subplots(figsize=(max(4, 0.45 * len(self.positions) + 2), max(2.5, 0.4 * len(self.layers) + 1.5)))
        image = axes.imshow(self.to_numpy(), cmap="RdBu_r", aspect="auto")
        axes.set_xticks(range(len(self.positions)), self._labels(), rotation=60, ha="right", fontsize=7)
        axes.set_yticks(range(len(self.layers)), [str(layer) for layer in self.layers])
        axes.set_xlabel("position")
        axes.set_ylabel("layer")
        axes.set_title(title or f"{self.metric} ({self.hook})")
        figure.colorbar(image, ax=axes)
        figure.tight_layout()
        figure.savefig(path, dpi=120)
        plt.close(figure)
        return path

    def render(self):
        """A rich Table: one row per layer, one column per position, cells shaded by value."""
        from rich.table import Table
        from rich.text import Text

        table = Table(title=f"{self.metric} ({self.hook}), source run {self.source_run}", show_lines=False)
        table.add_column("layer", justify="right")
        for label in self._labels():
            table.add_column(label, justify="right")
        values = [v for _, _, v in self.cells()]
        low, high = (min(values), max(values)) if values else (0.0, 0.0)
        for layer, row in zip(self.layers, self.grid):
            cells = [Text("—", style="dim") if v is None else Text(f"{v + 0.0:.3g}", style=f"on {_hex(_shade(v, low, high))}")
                     for v in row]
            table.add_row(str(layer), *cells)
        return table

    def __rich__(self):
        return self.render()

    def print(self, console: Any = None) -> None:
        from rich.console import Console

        (console or Console()).print(self.render())

    def to_text(self, width: int = 160) -> str:
        """The terminal rendering as plain text (no colours)."""
        import io

        from rich.console import Console

        console = Console(width=width, record=True, color_system=None, file=io.StringIO())
        console.print(self.render())
        return console.export_text()


def _shade(value: float, low: float, high: float) -> tuple[int, int, int]:
    """Blue (low) through white to red (high)."""
    t = 0.5 if high == low else (value - low) / (high - low)
    if t < 0.5:
        s = t / 0.5
        return int(40 + 215 * s), int(90 + 165 * s), 255
    s = (t - 0.5) / 0.5
    return 255, int(255 - 165 * s), int(255 - 215 * s)


def _hex(rgb: tuple[int, int, int]) -> str:
    return "#%02x%02x%02x" % rgb


# --------------------------------------------------------------------------------------------------
# the client
