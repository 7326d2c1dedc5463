"""``toolkit new-patch``: the skeleton it writes passes its own tests unchanged, and registers its patch.

Each engine's skeleton is generated into a temporary folder and installed with pip into a target folder
of its own; its tests then run in a separate interpreter whose PYTHONPATH holds that folder, so the new
patch's entry point is visible there and nowhere else in this suite. Conformance reads the cached
release trees: no engine venv, no download.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from toolkit import cli
from toolkit.kit._releases import LINES, KNOWN_RELEASES, releases_of
from toolkit.kit._scaffold import TARGETS, new_patch

from tests.toolkit.test_bad_input import one_sentence

ENGINES = tuple(TARGETS)


def name_for(engine: str) -> str:
    return f"hello-{engine}"


def clean_env(target: Path) -> dict[str, str]:
    """This interpreter's environment with ``target`` on PYTHONPATH and none of the outer pytest's."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env["PYTHONPATH"] = str(target)
    return env


@pytest.fixture(scope="module", params=ENGINES)
def installed(request, tmp_path_factory):
    """(engine, skeleton folder, pip target folder) with the skeleton pip-installed into the target."""
    engine = request.param
    root = tmp_path_factory.mktemp(f"new-patch-{engine}")
    folder = new_patch(name_for(engine), engine, root / "skeleton")
    target = root / "site"
    # as docs/writing-patches.md builds offline: the environment's setuptools, checked against the declared one
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--check-build-dependencies", "--target", str(target), str(folder)],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    return engine, folder, target


@pytest.mark.slow
@pytest.mark.packaging  # runs a built package's own suite: CI, not the quick loop
@pytest.mark.timeout(1800)  # SGLang's conformance: 19 releases, each composed with this project's patches
def test_the_skeleton_passes_its_own_tests_unchanged(installed):
    engine, folder, target = installed
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], cwd=folder,
                         env=clean_env(target), capture_output=True, text=True, timeout=1700)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "3 passed" in run.stdout  # the two golden tests and the conformance run: none skipped


def test_toolkit_list_shows_the_installed_patch(installed, tmp_path):
    engine, _, target = installed
    run = subprocess.run([sys.executable, "-m", "toolkit", "list", engine, "--json"], cwd=tmp_path,
                         env=clean_env(target), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    listed = {patch["id"]: patch for patch in json.loads(run.stdout)["patches"]}
    patch = listed[name_for(engine)]
    assert (patch["engine"], patch["versions"]) == (engine, TARGETS[engine].versions)
    assert patch["files"] == [TARGETS[engine].relpath]
    assert patch["runtime_modules"] == [f"toolkit_patch_hello_{engine}.runtime"]
    assert len(listed) > 1  # this project's own patches are still there beside it


def test_the_entry_point_is_visible_only_where_the_skeleton_is_installed(installed):
    from toolkit.patch_registry import registry

    assert name_for(installed[0]) not in {patch.id for patch in registry()}


@pytest.mark.parametrize("engine", ENGINES)
def test_the_skeleton_declares_every_known_release_of_its_engine(engine):
    known = [(dist, v) for dist, (line_engine, _) in LINES.items() if line_engine == engine
             for v in KNOWN_RELEASES[dist]]
    assert releases_of(engine, TARGETS[engine].versions) == known


def test_the_skeleton_declares_the_build_backend_this_project_requires(tmp_path):
    """The documented offline build (`pip install 'setuptools>=77'`, then --check-build-dependencies) works
    for a scaffolded patch too: it declares what this project and its examples declare."""
    ours = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())["build-system"]
    folder = new_patch("build-fix", "vllm", tmp_path / "p")
    theirs = tomllib.loads((folder / "pyproject.toml").read_text())["build-system"]
    assert theirs == ours and theirs["requires"] == ["setuptools>=77"]


def test_the_distribution_and_package_names_come_from_the_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    folder = new_patch("my-fix", "vllm")
    assert folder == tmp_path / "toolkit-patch-my-fix"
    pyproject = (folder / "pyproject.toml").read_text()
    assert 'name = "toolkit-patch-my-fix"' in pyproject
    assert 'my-fix = "toolkit_patch_my_fix.patch:PATCH"' in pyproject
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == [
        "README.md", "pyproject.toml", "tests/test_conformance.py", "tests/test_golden.py",
        "toolkit_patch_my_fix/__init__.py", "toolkit_patch_my_fix/codemods.py", "toolkit_patch_my_fix/patch.py",
        "toolkit_patch_my_fix/runtime.py"]
    runtime = (folder / "toolkit_patch_my_fix" / "runtime.py").read_text()
    assert "import libcst" not in runtime and "from toolkit" not in runtime  # it loads inside the engine


# ---- the command

def new_patch_cli(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(["new-patch", *argv])
    except SystemExit as exc:  # argparse's own refusals
        code = exc.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_command_writes_the_skeleton(tmp_path, capsys):
    code, out, _ = new_patch_cli(capsys, "my-fix", "--engine", "sglang", "--dir", str(tmp_path / "p"), "--json")
    assert code == 0
    data = json.loads(out)
    assert data["ok"] and data["distribution"] == "toolkit-patch-my-fix" and data["engine"] == "sglang"
    assert "toolkit_patch_my_fix/patch.py" in data["files"]
    assert 'engine="sglang"' in (tmp_path / "p" / "toolkit_patch_my_fix" / "patch.py").read_text()

    code, out, _ = new_patch_cli(capsys, "other-fix", "--engine", "vllm", "--dir", str(tmp_path / "q"))
    assert code == 0 and "toolkit-patch-other-fix" in out and "pip install -e '.[test]'" in out


def occupied(tmp_path: Path) -> str:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine\n")
    return str(tmp_path / "taken")


def a_file(tmp_path: Path) -> str:
    (tmp_path / "file").write_text("")
    return str(tmp_path / "file")


@pytest.mark.parametrize("argv, words", [
    (("My_Fix", "--engine", "vllm"), "is not lowercase words joined by hyphens"),
    (("9lives", "--engine", "vllm"), "starting with a letter"),
    (("fix-", "--engine", "sglang"), "is not lowercase words joined by hyphens"),
    (("tito", "--engine", "vllm"), "already has a registered patch named tito"),
    (("my-fix", "--engine", "vllm", "--dir", occupied), "is not empty"),
    (("my-fix", "--engine", "vllm", "--dir", a_file), "is a file"),
])
def test_bad_input_is_one_sentence_and_exit_2(argv, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = tuple(arg(tmp_path) if callable(arg) else arg for arg in argv)
    code, out, err = new_patch_cli(capsys, *argv)
    assert code == 2
    assert words in one_sentence(err)
    assert out == ""
    code, out, _ = new_patch_cli(capsys, *argv, "--json")
    data = json.loads(out)
    assert code == 2 and data["ok"] is False and data["kind"] == "usage" and words in data["error"]
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) in (
        [], ["taken", "taken/notes.txt"], ["file"])  # nothing written


def test_an_unknown_engine_is_refused_with_a_suggestion(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = new_patch_cli(capsys, "my-fix", "--engine", "vlm")
    assert code == 2 and "did you mean vllm?" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("existing", [False, True])
def test_a_write_stopped_midway_leaves_no_half_skeleton(existing, tmp_path, monkeypatch):
    """Ctrl-C (or a full disk) on the third file: the folder is as it was (absent, or empty), nothing
    is left beside it, and the next run writes the whole skeleton."""
    from toolkit.kit import _scaffold as scaffold

    folder = tmp_path / "fix"
    if existing:
        folder.mkdir()
    real_write, writes = Path.write_text, []

    def stop_on_the_third(self, *args, **kwargs):
        writes.append(self)
        if len(writes) == 3:
            raise KeyboardInterrupt
        return real_write(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", stop_on_the_third)
    with pytest.raises(KeyboardInterrupt):
        scaffold.new_patch("my-fix", "vllm", folder)
    assert sorted(p.name for p in tmp_path.iterdir()) == (["fix"] if existing else [])
    assert not existing or list(folder.iterdir()) == []
    monkeypatch.setattr(Path, "write_text", real_write)
    scaffold.new_patch("my-fix", "vllm", folder)
    assert len(scaffold.written_files(folder)) == len(scaffold.FILES)
    made = tmp_path / "made-by-mkdir"
    made.mkdir()
    assert (folder.stat().st_mode & 0o777) == (made.stat().st_mode & 0o777)  # the umask's mode, not 0700
