"""The worker's store of activations: the captures still being recorded (by key) and the finished
runs (by name), bounded in bytes, the oldest run evicted first. The forward hooks (worker.py) fill the
captures; the worker RPCs here commit, take, discard, list and delete them."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Run:
    name: str
    prompt: str
    token_ids: list[int]
    acts: dict[tuple[str, int], torch.Tensor]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.acts.values())

    def info(self, with_ids: bool = False) -> dict[str, Any]:
        layers: dict[str, list[int]] = {}
        for hook, layer in sorted(self.acts):
            layers.setdefault(hook, []).append(layer)
        info: dict[str, Any] = {"name": self.name, "prompt": self.prompt, "num_tokens": len(self.token_ids),
                                "captured": layers, "bytes": self.nbytes}
        if with_ids:
            info["prompt_token_ids"] = list(self.token_ids)
        return info


@dataclass
class Store:
    runs: OrderedDict[str, Run] = field(default_factory=OrderedDict)
    pending: dict[str, dict[tuple[str, int], torch.Tensor]] = field(default_factory=dict)  # captures by key
    max_bytes: int = 256 << 20  # set at install (TOOLKIT_PATCH_RUNS_MAX_BYTES)


STORE = Store()


# --------------------------------------------------------------------------------------------------
# collective_rpc("toolkit_patch_sweep_<op>") targets (worker.RPC); the first argument is the worker wrapper


def commit(wrapper: Any, key: str, name: str, prompt: str, token_ids: list[int]) -> dict[str, Any]:
    """Store the finished capture ``key`` as run ``name`` (replacing one of that name), evicting the
    oldest runs until the stored bytes fit the bound."""
    acts = STORE.pending.pop(key, None)
    if not acts:
        return {"error": f"capture {key} recorded nothing"}
    run = Run(name, prompt, list(token_ids), acts)
    if run.nbytes > STORE.max_bytes:
        return {"error": f"run {name!r} needs {run.nbytes} bytes, more than the store's bound of "
                         f"{STORE.max_bytes} (TOOLKIT_PATCH_RUNS_MAX_BYTES); capture fewer layers or hooks"}
    STORE.runs.pop(name, None)
    evicted = []
    while STORE.runs and sum(r.nbytes for r in STORE.runs.values()) + run.nbytes > STORE.max_bytes:
        evicted.append(STORE.runs.popitem(last=False)[0])
    STORE.runs[name] = run
    return {**run.info(), "evicted": evicted}


def discard(wrapper: Any, key: str) -> None:
    STORE.pending.pop(key, None)


def take(wrapper: Any, key: str, positions: list[int]) -> dict[str, Any]:
    """The finished capture ``key`` at ``positions`` as plain data ("hook.layer" -> dtype, shape, raw
    little-endian bytes), and forget it."""
    acts = STORE.pending.pop(key, None) or {}
    index = torch.tensor(positions, dtype=torch.long)
    out = {}
    for (hook, layer), buffer in acts.items():
        rows = buffer[index].detach().to("cpu").contiguous()
        out[f"{hook}.{layer}"] = {"dtype": str(rows.dtype).removeprefix("torch."), "shape": list(rows.shape),
                                  "data": rows.view(-1).view(torch.uint8).numpy().tobytes()}
    return out


def runs(wrapper: Any) -> dict[str, Any]:
    return {"runs": [run.info() for run in STORE.runs.values()],
            "used_bytes": sum(run.nbytes for run in STORE.runs.values()), "max_bytes": STORE.max_bytes}


def run(wrapper: Any, name: str) -> dict[str, Any] | None:
    found = STORE.runs.get(name)
    return None if found is None else found.info(with_ids=True)


def delete(wrapper: Any, name: str) -> bool:
    return STORE.runs.pop(name, None) is not None
