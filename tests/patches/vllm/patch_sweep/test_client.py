"""PatchStudy and SweepResult: unit tests of the result (no server), then the client against the
session's real patch-sweep server (conftest.py): server-side and per-cell paths agree."""

from __future__ import annotations

import math

import pytest

from toolkit.clients.patch_study import CapturedRun, PatchStudy, PatchStudyError, Span, SweepResult

CAT = ("The cat sat on the mat.", "The dog sat on the mat.")


def result(grid) -> SweepResult:
    return SweepResult(grid=grid, layers=[0, 1], positions=[3, 1, 2], position_tokens=["a", "b", "c"],
                       metric="logit_diff", hook="post_block", source_run="r")


def test_argmax_top_and_numpy():
    sweep = result([[0.5, None, 2.0], [-1.0, 2.0, 0.25]])
    assert sweep.argmax_cell() == (0, 2, 2.0)  # ties: grid order
    assert sweep.top(3) == [(0, 2, 2.0), (1, 1, 2.0), (0, 3, 0.5)]
    array = sweep.to_numpy()
    assert array.shape == (2, 3) and math.isnan(array[0, 1]) and array[1, 0] == -1.0
    assert result([[None, None, None], [None, None, None]]).argmax_cell() is None


def test_plot_writes_a_labelled_png_and_the_terminal_rendering_names_tokens(tmp_path):
    sweep = result([[0.5, None, 2.0], [-1.0, 2.0, 0.25]])
    path = sweep.plot(tmp_path / "heat.png", title="recovered")
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and b"IDAT" in data and data.endswith(b"IEND\xaeB`\x82")
    import matplotlib.image

    pixels = matplotlib.image.imread(path)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100  # a figure, not one pixel a cell
    text = sweep.to_text()
    assert "3:'a'" in text and "2:'c'" in text and "—" in text and "0.25" in text


def test_plot_without_matplotlib_is_one_sentence_naming_the_extra(tmp_path, monkeypatch):
    import sys

    from toolkit.base.extras import MissingExtra

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # what an environment without it looks like to imports
    with pytest.raises(MissingExtra, match=r"plot\(\) needs the 'plot' extra \(matplotlib not installed\): "
                                           r"pip install 'serving-toolkit\[plot\]'"):
        result([[1.0, 2.0, 3.0], [0.0, 1.0, 2.0]]).plot(tmp_path / "heat.png")
    assert not (tmp_path / "heat.png").exists()


def test_per_cell_path_refuses_clean_prompt_without_a_captured_run():
    study = PatchStudy("http://127.0.0.1:9")  # nothing is sent: the call is refused first
    with pytest.raises(ValueError, match="clean_prompt needs server_side=True"):
        study.sweep_layers_positions("x", clean_prompt="y", answer_token_id=1, server_side=False)
    with pytest.raises(PatchStudyError, match="give run="):
        study.sweep_layers_positions("x", answer_token_id=1)


# --------------------------------------------------------------------------------------------------
# against the real server



@pytest.mark.parametrize("metric", ["logprob", "logit_diff", "recovered"])
@pytest.mark.engine
@pytest.mark.server
def test_server_side_and_per_cell_paths_agree(sweep_server, metric):
    study = PatchStudy(sweep_server.base_url)
    run = study.capture(CAT[0], layers=[0, 1], hooks=["post_attn"])
    assert isinstance(run, CapturedRun) and run.captured == {"post_attn": [0, 1]}
    kwargs = dict(layers="all", positions=[Span("dog"), 0, Span("at", 1)], hook="post_attn", answer_token=" mat",
                  foil_token=" the", metric=metric)
    seen_server: list = []
    seen_cells: list = []
    server = study.sweep_layers_positions(CAT[1], run=run, on_cell=lambda *c: seen_server.append(c), **kwargs)
    cells = study.sweep_layers_positions(CAT[1], run=run, server_side=False, on_cell=lambda *c: seen_cells.append(c),
                                         **kwargs)
    assert server.positions == cells.positions and server.layers == cells.layers == [0, 1]
    assert len(server.positions) == 4  # ' do', 'g', 'The', and the 'at' of "sat"
    for got_row, want_row in zip(cells.grid, server.grid):
        for got, want in zip(got_row, want_row):
            assert abs(got - want) <= 1e-4
    assert sorted((l, p) for l, p, _ in seen_server) == sorted((l, p) for l, p, _ in seen_cells)
    assert len(seen_server) == 8
    assert server.argmax_cell()[:2] == cells.argmax_cell()[:2]


@pytest.mark.engine
@pytest.mark.server
def test_clean_prompt_is_captured_in_the_same_call(sweep_server):
    study = PatchStudy(sweep_server.base_url)
    result = study.sweep_layers_positions(CAT[1], clean_prompt=CAT[0], layers=[1], positions=[Span("dog")],
                                          answer_token=" mat")
    assert result.auto_captured is True and result.captured_source_run == result.source_run
    assert result.source_run.startswith("study-") and result.source_run in [r["name"] for r in study.runs()]
    study.delete(result.source_run)
    assert result.source_run not in [r["name"] for r in study.runs()]


@pytest.mark.engine
@pytest.mark.server
def test_server_errors_surface_as_patch_study_errors(sweep_server):
    study = PatchStudy(sweep_server.base_url)
    with pytest.raises(PatchStudyError, match="span 'zebra' not found"):
        study.sweep_layers_positions(CAT[1], clean_prompt=CAT[0], positions=[Span("zebra")], answer_token=" mat")


# --------------------------------------------------------------------------------------------------
# a client-only environment: no libcst, no patch engine

# Run in a fresh interpreter: a meta-path finder refuses libcst and the patch engine's modules, then
# the client is imported by its public name and (when a server URL is given) drives a real study.
CLIENT_ONLY = r'''
import sys
REFUSED = ("libcst", "toolkit.engine.patching", "toolkit.engine.transform", "toolkit.codemod", "toolkit.api", "toolkit.engine.state")

class Refuse:
    def find_spec(self, name, path=None, target=None):
        if any(name == r or name.startswith(r + ".") for r in REFUSED):
            raise ImportError(f"No module named {name!r} (refused: a client-only environment)")

sys.meta_path.insert(0, Refuse())
from toolkit.patch_study import PatchStudy, Span
study = PatchStudy(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:9")
if len(sys.argv) > 1:
    result = study.sweep_layers_positions("The dog sat on the mat.", clean_prompt="The cat sat on the mat.",
                                          layers=[1], positions=[Span("dog"), 0], answer_token=" mat")
    print("GRID", result.grid)
    study.delete(result.source_run)
loaded = sorted(m for m in sys.modules if any(m == r or m.startswith(r + ".") for r in REFUSED))
print("LOADED", loaded)
'''


def _client_only(*args: str) -> str:
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[4]
    done = subprocess.run([sys.executable, "-c", CLIENT_ONLY, *args], capture_output=True, text=True, timeout=300,
                          cwd=str(repo))
    assert done.returncode == 0, done.stderr
    assert "LOADED []" in done.stdout, done.stdout
    return done.stdout


def test_client_imports_without_libcst_or_the_patch_engine():
    _client_only()


@pytest.mark.engine
@pytest.mark.server
def test_client_without_libcst_runs_a_sweep_against_a_real_server(sweep_server):
    import ast

    out = _client_only(sweep_server.base_url)
    grid = ast.literal_eval(out.split("GRID ", 1)[1].splitlines()[0])
    assert len(grid) == 1 and len(grid[0]) == 3 and all(isinstance(v, float) for v in grid[0])


def test_steering_is_refused_unless_the_server_enables_it(monkeypatch):
    """The switch is read before anything else, so no engine is needed to see the refusal (the server
    tests run with it on)."""
    import asyncio

    from toolkit.patches.vllm.patch_sweep import steering

    monkeypatch.delenv("TOOLKIT_ENABLE_STEERING", raising=False)
    with pytest.raises(steering.BadRequest, match="steering is off on this server"):
        asyncio.run(steering.rewrite(None, {"prompt": "x", "steering": []}))
    monkeypatch.setenv("TOOLKIT_ENABLE_STEERING", "0")
    with pytest.raises(steering.BadRequest, match="TOOLKIT_ENABLE_STEERING=1"):
        asyncio.run(steering.rewrite(None, {"prompt": "x", "steering": []}))
