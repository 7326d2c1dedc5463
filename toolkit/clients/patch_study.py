"""PatchStudy: the client of the patch-sweep server (vLLM with ``patch-sweep`` applied and
``TOOLKIT_ENABLE_PATCHING=1``).

    from toolkit.clients.patch_study import PatchStudy, Span

    study = PatchStudy("http://localhost:8000")
    clean = study.capture("The Eiffel Tower is in the city of")
    result = study.sweep_layers_positions(
        "The Colosseum is in the city of", run=clean, layers="all",
        positions=[Span("Colosseum"), 0], answer_token=" Paris", foil_token=" Rome", metric="recovered")
    result.argmax_cell(); result.top(5); result.plot("heatmap.png"); result.print()

``server_side=True`` (the default) sends one request and the server runs every cell as a batched vLLM
request; ``server_side=False`` sends one HTTP request per cell, with spans resolved here by the same
module the server uses (``toolkit.patches.common.spans``), which needs the model's tokenizer (transformers).

Only the standard library is needed for HTTP; numpy for ``to_numpy`` (the ``client`` extra); matplotlib
for ``plot`` (the ``plot`` extra; without it ``plot`` stops with one sentence naming it); rich (a toolkit
dependency) for the terminal.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from toolkit.patches.common.spans import ALL_PROMPT, Span, prompt_char_offsets, resolve_positions

__all__ = ["Activations", "CapturedRun", "PatchStudy", "PatchStudyError", "Span", "SweepResult"]

Cell = tuple[int, int, float]  # (layer, position, value)
OnCell = Callable[[int, int, "float | None"], None]


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
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_response(cls, data: dict[str, Any]) -> "SweepResult":
        return cls(grid=[list(row) for row in data["grid"]], layers=list(data["layers"]),
                   positions=list(data["positions"]), position_tokens=list(data.get("position_tokens") or []),
                   metric=data.get("metric", ""), hook=data.get("hook", ""), baselines=data.get("baselines"),
                   skipped=list(data.get("skipped") or []), noise_floor=data.get("noise_floor"),
                   source_run=data.get("source_run", ""), auto_captured=bool(data.get("auto_captured")),
                   captured_source_run=data.get("captured_source_run"), prefix_reuse=data.get("prefix_reuse"),
                   executor=data.get("executor", ""), raw=data)

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


class PatchStudy:
    """Activation-patching studies against one patch-sweep server."""

    def __init__(self, base_url: str, *, model: str | None = None, tokenizer: Any = None, timeout: float = 600):
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._model = model
        self._tokenizer = tokenizer

    # ---------------------------------------------------------------------------------------------
    # HTTP

    def _request(self, method: str, path: str, body: dict | None = None):
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers={"content-type": "application/json"})
        try:
            return urllib.request.urlopen(request, timeout=self.timeout)
        except urllib.error.HTTPError as error:
            try:
                message = json.loads(error.read())["error"]["message"]
            except Exception:
                message = f"HTTP {error.code}"
            raise PatchStudyError(f"{method} {path}: {message}", status=error.code) from None

    def _json(self, method: str, path: str, body: dict | None = None) -> Any:
        with self._request(method, path, body) as response:
            return json.loads(response.read())

    def _events(self, body: dict) -> Iterator[tuple[str, Any]]:
        with self._request("POST", "/v1/patch_sweep", {**body, "stream": True}) as response:
            kind = "message"
            for raw in response:
                line = raw.decode().rstrip("\r\n")
                if line.startswith("event: "):
                    kind = line[len("event: "):]
                elif line.startswith("data: "):
                    data = line[len("data: "):]
                    if data == "[DONE]":
                        return
                    yield kind, json.loads(data)

    # ---------------------------------------------------------------------------------------------
    # runs

    def capture(self, prompt: str, name: str | None = None, *, layers: Any = None,
                hooks: Sequence[str] | None = None) -> CapturedRun:
        """Store ``prompt``'s activations on the server (all layers and hook points unless narrowed)."""
        body: dict[str, Any] = {"prompt": prompt}
        for key, value in (("name", name), ("layers", layers), ("hooks", list(hooks) if hooks else None)):
            if value is not None:
                body[key] = value
        return CapturedRun.from_json(self._json("POST", "/v1/patch_runs", body))

    def runs(self) -> list[dict[str, Any]]:
        return self._json("GET", "/v1/patch_runs")["runs"]

    def delete(self, run: str | CapturedRun) -> None:
        self._json("DELETE", f"/v1/patch_runs/{_run_name(run)}")

    # ---------------------------------------------------------------------------------------------
    # activations

    def activations(self, prompt: str | None = None, *, messages: list[dict[str, str]] | None = None,
                    prompt_token_ids: Sequence[int] | None = None, layers: Any = "all",
                    hooks: Sequence[str] = ("post_block",), positions: Any = ALL_PROMPT,
                    encoding: str = "safetensors") -> Activations:
        """The activations of one prompt (text, chat ``messages`` or token ids) at ``hooks`` x ``layers``
        for ``positions`` (integers and :class:`Span` markers), as numpy arrays."""
        body: dict[str, Any] = {"layers": layers, "hooks": list(hooks), "encoding": encoding,
                                "positions": positions if positions == ALL_PROMPT else
                                [p.to_json() if isinstance(p, Span) else p for p in positions]}
        for key, value in (("prompt", prompt), ("messages", messages),
                           ("prompt_token_ids", None if prompt_token_ids is None else list(prompt_token_ids))):
            if value is not None:
                body[key] = value
        with self._request("POST", "/v1/activations", body) as response:
            blob = response.read()
        return Activations.from_safetensors(blob) if encoding == "safetensors" else Activations.from_json(json.loads(blob))

    # ---------------------------------------------------------------------------------------------
    # sweeps

    def sweep_layers_positions(
        self,
        prompt: str,
        run: str | CapturedRun | None = None,
        clean_prompt: str | None = None,
        *,
        layers: Any = "all",
        positions: Any = ALL_PROMPT,
        hook: str = "post_block",
        answer_token: str | None = None,
        foil_token: str | None = None,
        answer_token_id: int | None = None,
        foil_token_id: int | None = None,
        metric: str | None = None,
        alpha: float = 1.0,
        server_side: bool = True,
        on_cell: OnCell | None = None,
        prefix_reuse: bool = True,
        executor: str | None = None,
    ) -> SweepResult:
        """Patch ``run``'s activations (or ``clean_prompt``'s, captured in the same call) into ``prompt``
        at every (layer, position); ``positions`` mixes integers and :class:`Span` markers.
        ``prefix_reuse=False`` makes every cell recompute the whole prompt (the grid is the same);
        ``executor`` picks how the server runs the cells (``"auto"``, ``"batched"``, ``"requests"``)."""
        body: dict[str, Any] = {"prompt": prompt, "hook": hook, "layers": layers, "alpha": alpha,
                                "positions": positions if positions == ALL_PROMPT else
                                [p.to_json() if isinstance(p, Span) else p for p in positions]}
        for key, value in (("answer_token", answer_token), ("foil_token", foil_token),
                           ("answer_token_id", answer_token_id), ("foil_token_id", foil_token_id), ("metric", metric)):
            if value is not None:
                body[key] = value
        if run is not None:
            body["source_run"] = _run_name(run)
        if not prefix_reuse:
            body["prefix_reuse"] = False
        if executor is not None:
            body["executor"] = executor
        if server_side:
            if clean_prompt is not None:
                body["clean_prompt"] = clean_prompt
                body.setdefault("source_run", f"study-{uuid.uuid4().hex[:12]}")  # a fresh run per call
            if run is None and clean_prompt is None:
                raise PatchStudyError("give run= (a captured run) or clean_prompt= (captured in the same call)")
            if on_cell is None:
                return SweepResult.from_response(self._json("POST", "/v1/patch_sweep", body))
            summary = None
            for kind, data in self._events(body):
                if kind == "cell":
                    on_cell(data["layer"], data["position"], data["value"])
                elif kind == "summary":
                    summary = data
            if summary is None:
                raise PatchStudyError("the server's stream ended without a summary")
            return SweepResult.from_response(summary)
        if run is None:
            raise PatchStudyError(
                "clean_prompt needs server_side=True (the server captures it in the same call); for the per-cell "
                "path capture it first: run = study.capture(clean_prompt), then pass run=run"
                if clean_prompt is not None else "give run= (a captured run) for the per-cell path")
        return self._per_cell(prompt, body, on_cell)

    def _per_cell(self, prompt: str, body: dict[str, Any], on_cell: OnCell | None) -> SweepResult:
        """One HTTP request per cell, positions resolved here with the server's own span module."""
        tokenizer = self.tokenizer()
        ids = tokenizer.encode(prompt, add_special_tokens=True)
        positions = resolve_positions(body["positions"], prompt_char_offsets(tokenizer, prompt, ids))
        metric = body.get("metric") or ("logit_diff" if "foil_token" in body or "foil_token_id" in body else "logprob")
        raw_metric = metric if metric != "recovered" else (
            "logit_diff" if "foil_token" in body or "foil_token_id" in body else "logprob")
        # baselines, the noise floor and the resolved layer axis (its cells are not used: each cell is redone alone)
        first = self._json("POST", "/v1/patch_sweep", {**body, "positions": positions[:1], "metric": raw_metric})
        layers, baselines = first["layers"], first["baselines"]
        base_key = first["noise_floor"]["metric"]
        gap = baselines["clean"][base_key] - baselines["corrupt"][base_key]
        grid: list[list[float | None]] = []
        skipped: list[dict[str, Any]] = []
        for layer in layers:
            row: list[float | None] = []
            for position in positions:
                cell = self._json("POST", "/v1/patch_sweep", {**body, "layers": [layer], "positions": [position],
                                                              "metric": raw_metric, "baselines": False})
                value = cell["grid"][0][0]
                skipped += cell["skipped"]
                if value is not None and metric == "recovered":
                    value = None if gap == 0 else (value - baselines["corrupt"][base_key]) / gap
                row.append(value)
                if on_cell is not None:
                    on_cell(layer, position, value)
            grid.append(row)
        return SweepResult(grid=grid, layers=layers, positions=positions,
                           position_tokens=[tokenizer.decode([ids[p]]) for p in positions], metric=metric,
                           hook=body["hook"], baselines=baselines, skipped=skipped, noise_floor=first["noise_floor"],
                           source_run=body["source_run"], raw=first)

    # ---------------------------------------------------------------------------------------------
    # the tokenizer (per-cell path only)

    def tokenizer(self) -> Any:
        """The served model's tokenizer (transformers), for resolving spans here."""
        if self._tokenizer is None:
            try:
                from transformers import AutoTokenizer
            except ImportError:
                raise PatchStudyError("server_side=False resolves spans locally and needs transformers "
                                      "(pip install transformers), or pass tokenizer= to PatchStudy") from None
            model = self._model or self._json("GET", "/v1/models")["data"][0]["id"]
            self._tokenizer = AutoTokenizer.from_pretrained(model)
        return self._tokenizer


def _run_name(run: str | CapturedRun) -> str:
    return run.name if isinstance(run, CapturedRun) else str(run)
