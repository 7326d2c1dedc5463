"""Words that are true (issue 51): "applied now" names only what the run applied; a drifted row for a
patch whose package was uninstalled says what is so and what to run (and that works); the scaffold's
hint installs what its tests need; ``check --source`` reads a bare engine folder given its release."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import shutil
import tomllib

import pytest

from tests.toolkit import demo_patches
from tests.toolkit.test_bad_input import one_sentence, run
from toolkit import api, patch_registry
from toolkit.engine.sources import load_source

THEIRS = dataclasses.replace(demo_patches.SECOND, id="their-fix", runtime_modules=())  # another package's patch


@pytest.fixture
def registered(monkeypatch):
    """The registry as it is now; ``registered(...)`` sets it (a package installed or uninstalled)."""
    def register(*patches):
        monkeypatch.setattr(patch_registry, "registry", lambda: list(patches))
    register(demo_patches.DEMO, demo_patches.SECOND)
    return register


@pytest.fixture
def site(tmp_path, monkeypatch, registered):
    """A demo SGLang 0.5.9 tree that the CLI finds as this interpreter's install."""
    site = demo_patches.make_engine_tree(tmp_path / "site")
    monkeypatch.setattr(api, "find_engines", lambda python=None: [load_source(site).as_installed()])
    return site


def test_applied_now_names_only_what_this_run_applied(site, capsys):
    code, out, _ = run(capsys, "apply-patch", "sglang", "--patch", "demo")
    assert code == 0 and "changed 2 file(s); applied now: demo" in out
    code, out, _ = run(capsys, "apply-patch", "sglang")
    line = next(line for line in out.splitlines() if "changed" in line)
    assert code == 0 and line.endswith("changed 1 file(s); applied now: second (already applied: demo)"), out
    assert run(capsys, "revert", "sglang", "--patch", "second")[0] == 0
    code, out, _ = run(capsys, "apply-patch", "sglang", "--dry-run", "--json")
    (entry,) = json.loads(out)["engines"]
    assert (entry["newly_applied"], entry["applied_patches"]) == (["second"], ["demo", "second"])
    code, out, _ = run(capsys, "apply-patch", "sglang", "--json")
    (entry,) = json.loads(out)["engines"]
    assert (entry["newly_applied"], entry["applied_patches"]) == (["second"], ["demo", "second"])
    code, out, _ = run(capsys, "apply-patch", "sglang", "--json")  # nothing to do: nothing applied now
    (entry,) = json.loads(out)["engines"]
    assert entry["unchanged"] and entry["newly_applied"] == [] and entry["applied_patches"] == ["demo", "second"]


def test_an_uninstalled_packages_patch_says_what_is_so_and_what_to_run(site, capsys, registered):
    registered(demo_patches.DEMO, THEIRS)
    assert run(capsys, "apply-patch", "sglang")[0] == 0
    registered(demo_patches.DEMO)  # `pip uninstall` of the package that registered their-fix
    code, out, _ = run(capsys, "status", "--json")
    detail = next(r["detail"] for r in json.loads(out)["patches"] if r["patch_id"] == "their-fix")
    assert "no installed package registers their-fix now" in detail
    commands = re.findall(r"`(toolkit [^`]+)`", detail)
    assert commands == ["toolkit revert sglang", "toolkit apply-patch sglang"], detail
    code, out, _ = run(capsys, "status")
    row = next(line for line in out.splitlines() if "their-fix" in line)
    assert code == 1 and "drifted" in row and "`toolkit revert sglang`" in row
    assert "version not proved" not in row and "allow-unknown-version" not in row  # the version is not the problem
    for command in commands:  # what the row says to run does what it says
        assert run(capsys, *shlex.split(command)[1:])[0] == 0
    code, out, _ = run(capsys, "status", "--json")
    assert code == 0 and {(r["patch_id"], r["state"]) for r in json.loads(out)["patches"]} == {("demo", "applied")}


def test_the_scaffold_hint_installs_pytest(tmp_path, capsys):
    code, out, _ = run(capsys, "new-patch", "my-fix", "--engine", "sglang", "--dir", str(tmp_path / "p"))
    hint = next(line for line in out.splitlines() if line.startswith("next:"))
    install = next(part for part in hint.split("&&") if "pip install" in part)
    requirement = shlex.split(install)[-1]  # e.g. .[test]
    extras = re.fullmatch(r"\.(?:\[(.*)\])?", requirement).group(1) or ""
    pyproject = tomllib.loads((tmp_path / "p" / "pyproject.toml").read_text())
    optional = pyproject["project"].get("optional-dependencies", {})
    wanted = [req for extra in filter(None, extras.split(",")) for req in optional[extra.strip()]]
    assert any(re.match(r"pytest\b", req) for req in wanted), (hint, optional)
    assert "python -m pytest" in hint
    readme = (tmp_path / "p" / "README.md").read_text()
    assert "pip install -e '.[test]'" in readme and "pip install -e .  " not in readme


@pytest.mark.parametrize("where", ["package folder", "folder holding it"])
def test_check_reads_a_bare_engine_folder_given_its_release(tmp_path, capsys, registered, where):
    site = demo_patches.make_engine_tree(tmp_path / "site")
    shutil.rmtree(site / "sglang-0.5.9.dist-info")  # a source checkout or a copied package: no metadata
    folder = site / "sglang" if where == "package folder" else site
    code, _, err = run(capsys, "check", "--source", str(folder))
    assert code == 2 and "--release DIST==VERSION" in one_sentence(err)
    code, out, err = run(capsys, "check", "--source", str(folder), "--release", "sglang==0.5.9", "--json")
    data = json.loads(out)
    assert code == 0 and data["ok"], err
    assert (data["distribution"], data["version"], data["engine"]) == ("sglang", "0.5.9", "sglang")
    anchors = {(a["patch_id"], a["relpath"], a["ok"]) for p in data["patches"] for a in p["anchors"]}
    assert anchors == {("demo", "srt/protocol.py", True), ("demo", "srt/serving.py", True),
                       ("second", "srt/serving.py", True)}
    code, out, _ = run(capsys, "check", "--source", str(folder), "--release", "sglang==0.5.9")
    assert code == 0 and "demo: would apply" in out


def test_check_release_of_a_folder_without_the_package_is_one_sentence(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    for release, says in (("sglang==0.5.9", "not sglang's package folder (sglang/) nor a folder holding one"),
                          ("sgl==0.5.9", "unknown engine distribution 'sgl'"),
                          ("sglang", "expected DIST==VERSION")):
        code, _, err = run(capsys, "check", "--source", str(tmp_path / "empty"), "--release", release)
        assert code == 2 and says in one_sentence(err), err
