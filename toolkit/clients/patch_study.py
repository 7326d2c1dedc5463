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
import urllib.error
import urllib.request
import uuid
from typing import Any, Callable, Iterator, Sequence

from toolkit.clients.sweep_results import Activations, CapturedRun, PatchStudyError, SweepResult
from toolkit.patches.common.spans import ALL_PROMPT, Span, prompt_char_offsets, resolve_positions

__all__ = ["Activations", "CapturedRun", "PatchStudy", "PatchStudyError", "Span", "SweepResult"]

OnCell = Callable[[int, int, "float | None"], None]


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
