"""What a full revert leaves behind, as docs/reliability.md says (issue 58): the release's bytes, no
manifest and no backups, but the state folder's empty ``lock`` (removing it would let two runs hold
locks on two files at once) and no cached bytecode of the files it put back, which the next import
compiles and caches again."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys
from importlib.util import cache_from_source

from toolkit import patch_registry
from toolkit.engine import patching as engine
from toolkit.engine.sources import load_source

from tests.toolkit import demo_patches


def test_a_full_revert_leaves_an_empty_lock_and_bytecode_python_writes_again(tmp_path):
    site = demo_patches.make_engine_tree(tmp_path / "site")
    serving = site / "sglang" / "srt" / "serving.py"
    pristine = serving.read_bytes()
    py_compile.compile(str(serving), cfile=cache_from_source(str(serving)))  # as pip compiles at install
    installed = load_source(site).as_installed()
    catalog = patch_registry.catalog("sglang", [demo_patches.SECOND])
    engine.apply(installed, [demo_patches.SECOND], catalog=catalog)
    engine.revert(installed, catalog=catalog)
    assert serving.read_bytes() == pristine
    state = site / ".toolkit-state" / "sglang"
    assert sorted(p.name for p in state.iterdir()) == ["lock"] and (state / "lock").read_bytes() == b""
    assert not os.path.exists(cache_from_source(str(serving)))  # deleted with the patched bytes it cached
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([sys.executable, "-c", "import sglang.srt.serving"], cwd=site, env=env, check=True)
    assert os.path.exists(cache_from_source(str(serving)))  # the next import writes it again
