"""Install shapes that once lost a file's mode, put the state outside site-packages or left the release's
code running (issue 49), on the demo engine tree with real files, real links and real interpreters.

- A symbolic link at the engine's package directory, at a folder in it or at a file a patch edits:
  apply and revert refuse it in one sentence before anything is written (no lock, no state directory),
  the link stays a link; `status`, `check` and `repair` (when it has nothing to write through it) work.
- No file toolkit writes is group- or world-writable unless the release's file was, whatever the umask.
- Apply and revert remove every cached bytecode of a file they replace: every optimisation level and
  interpreter tag in ``__pycache__``, and a legacy ``name.pyc`` beside it; `python -O` then runs the
  file as it is on disk.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import py_compile
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.toolkit import demo_patches
from toolkit import cli
from toolkit.engine import patching as engine, fs
from toolkit.engine.discovery import find_engines_here
from toolkit.errors import PatchError
from toolkit.engine.repair import repair
from toolkit.engine.sources import load_source
from toolkit.engine.state import StateDir
from tests.harness import by_id

pytestmark = pytest.mark.usefixtures("demo_registry")  # the demo patches (tests/toolkit/conftest.py)

PROTOCOL = "sglang/srt/protocol.py"


def snapshot(*roots: Path) -> dict[str, tuple]:
    """Every path under ``roots`` (links not followed): its kind, mode, bytes or link target."""
    seen: dict[str, tuple] = {}
    for root in roots:
        for path in [root, *sorted(root.rglob("*"))]:
            info = path.lstat()
            if stat.S_ISLNK(info.st_mode):
                seen[str(path)] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                seen[str(path)] = ("dir", stat.S_IMODE(info.st_mode))
            else:
                seen[str(path)] = ("file", stat.S_IMODE(info.st_mode), path.read_bytes())
    return seen


def no_download(distribution, version):
    raise AssertionError("repair must not need the release wheel here")


def assert_refused(call, link: Path) -> None:
    with pytest.raises(PatchError) as caught:
        call()
    message = str(caught.value)
    assert f"{link} is a symbolic link" in message and "nothing was written" in message, message
    assert "\n" not in message


# --------------------------------------------------------------------------------------------------
# a symbolic link at an engine file


@pytest.fixture
def linked_file(tmp_path):
    """The demo tree with srt/protocol.py a link to a release copy outside site-packages."""
    site = demo_patches.make_engine_tree(tmp_path / "site")
    demo_patches.write_record(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    target = elsewhere / "protocol.py"
    shutil.move(site / PROTOCOL, target)
    os.chmod(target, 0o644)
    (site / PROTOCOL).symlink_to(target)
    return site, elsewhere


def test_a_symlinked_engine_file_is_refused_before_anything_is_written(linked_file, capsys, monkeypatch):
    site, elsewhere = linked_file
    installed = load_source(site).as_installed()
    before = snapshot(site, elsewhere)
    for call in (lambda: by_id.apply(installed, ["demo"]), lambda: by_id.apply(installed, ["demo"], dry_run=True),
                 lambda: engine.apply(installed), lambda: engine.revert(installed)):
        assert_refused(call, site / PROTOCOL)
        assert snapshot(site, elsewhere) == before  # the link is a link, no lock, no .toolkit-state
    monkeypatch.setattr("toolkit.api.find_engines", lambda python=None: [installed])
    assert cli.main(["apply-patch"]) == 1
    err = capsys.readouterr().err
    assert "is a symbolic link" in err and len(err.strip().splitlines()) == 1
    assert snapshot(site, elsewhere) == before
    # reading through the link is fine: status, check and a repair with nothing to write
    assert {row.patch_id: row.state for row in engine.status(installed)} == {"demo": "not applied",
                                                                            "second": "not applied"}
    assert cli.main(["check", "--source", str(site), "--json"]) == 0
    capsys.readouterr()
    result = repair(installed, no_download)
    assert result.restored == {}
    assert {k: v for k, v in snapshot(site, elsewhere).items() if ".toolkit-state" not in k} == before


def test_a_file_made_a_link_after_patching_is_not_reverted_through_it(tmp_path):
    """A patched file that became a link since: revert and repair refuse (the old code replaced the link
    by a regular file with the link's mode, 0777); once the link is a copy again, revert restores it."""
    site = demo_patches.make_engine_tree(tmp_path / "site")
    demo_patches.write_record(site)
    installed = load_source(site).as_installed()
    by_id.apply(installed, ["demo"])
    patched = (site / PROTOCOL).read_bytes()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(site / PROTOCOL, elsewhere / "protocol.py")
    (site / PROTOCOL).symlink_to(elsewhere / "protocol.py")
    assert {row.patch_id: row.state for row in engine.status(installed)}["demo"] == "applied"  # bytes say so
    before = snapshot(site, elsewhere)
    assert_refused(lambda: engine.revert(installed), site / PROTOCOL)
    assert_refused(lambda: engine.revert(installed, force=True), site / PROTOCOL)
    assert_refused(lambda: repair(installed, no_download), site / PROTOCOL)
    assert snapshot(site, elsewhere) == before
    # the fix the sentence names: a copy in place of the link
    (site / PROTOCOL).unlink()
    shutil.copy(elsewhere / "protocol.py", site / PROTOCOL)
    os.chmod(site / PROTOCOL, 0o644)
    engine.revert(installed)
    assert (site / PROTOCOL).read_text() == demo_patches.PROTOCOL
    assert stat.S_IMODE((site / PROTOCOL).lstat().st_mode) == 0o644
    assert (elsewhere / "protocol.py").read_bytes() == patched


def test_a_symlinked_folder_inside_the_package_is_refused(tmp_path):
    site = demo_patches.make_engine_tree(tmp_path / "site")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(site / "sglang/srt", elsewhere / "srt")
    (site / "sglang/srt").symlink_to(elsewhere / "srt", target_is_directory=True)
    installed = load_source(site).as_installed()
    before = snapshot(site, elsewhere)
    assert_refused(lambda: by_id.apply(installed, ["demo"]), site / "sglang/srt")
    assert snapshot(site, elsewhere) == before


# --------------------------------------------------------------------------------------------------
# a symbolic link at the package directory (site-packages/sglang -> elsewhere)


@pytest.fixture
def linked_package(tmp_path, monkeypatch):
    """site-packages/sglang a link to a tree elsewhere, found the way `toolkit` finds engines (on
    sys.path, by importlib)."""
    site = demo_patches.make_engine_tree(tmp_path / "site")
    demo_patches.write_record(site)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    shutil.move(site / "sglang", elsewhere / "sglang")
    (site / "sglang").symlink_to(elsewhere / "sglang", target_is_directory=True)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    (installed,) = [e for e in find_engines_here() if e.engine == "sglang"]
    return site, elsewhere, installed


def test_a_symlinked_package_dir_is_found_where_it_is_installed(linked_package):
    site, elsewhere, installed = linked_package
    assert Path(installed.package_dir) == site / "sglang"  # not resolved: the state stays in site-packages
    assert installed.site_dir == site


def test_a_symlinked_package_dir_is_refused_and_repair_still_works(linked_package, capsys, monkeypatch):
    site, elsewhere, installed = linked_package
    before = snapshot(site, elsewhere)
    for call in (lambda: by_id.apply(installed, ["demo"]), lambda: engine.revert(installed)):
        assert_refused(call, site / "sglang")
        assert snapshot(site, elsewhere) == before
    monkeypatch.setattr("toolkit.api.find_engines", lambda python=None: [installed])
    assert cli.main(["apply-patch", "--json"]) == 1
    assert '"ok": false' in capsys.readouterr().out
    assert snapshot(site, elsewhere) == before
    assert set(row.state for row in engine.status(installed)) == {"not applied"}
    assert cli.main(["check", "--source", str(site), "--json"]) == 0  # reads through the link
    capsys.readouterr()
    # the old code looked for pip's RECORD beside the link's target: "no readable RECORD"
    result = repair(installed, no_download)
    assert result.restored == {} and result.unverifiable == []
    assert not (elsewhere / ".toolkit-state").exists()
    assert (site / "sglang").is_symlink()


# --------------------------------------------------------------------------------------------------
# modes


def test_nothing_written_is_group_or_world_writable_unless_the_release_was(tmp_path):
    """umask 0 and a 0777 release file: the patched and the restored file keep the release's mode
    (0777 and 0644), every staged file has it before its rename, backups, manifest and lock are 0644."""
    site = demo_patches.make_engine_tree(tmp_path / "site")
    installed = load_source(site).as_installed()
    os.chmod(site / PROTOCOL, 0o777)
    os.chmod(site / "sglang/srt/serving.py", 0o644)
    release = {p: (p.read_bytes(), stat.S_IMODE(p.lstat().st_mode)) for p in (site / "sglang/srt").glob("*.py")}
    staged_modes: list[tuple[str, int]] = []
    real_replace = fs.replace

    def replace(src, dst):
        staged_modes.append((str(dst), stat.S_IMODE(os.lstat(src).st_mode)))
        real_replace(src, dst)

    old_umask = os.umask(0)
    try:
        fs.replace = replace
        by_id.apply(installed, ["demo", "second"])
        state = site / ".toolkit-state"
        written = [p for p in [state, *state.rglob("*")]]
        for path in written:
            mode = stat.S_IMODE(path.lstat().st_mode)
            assert mode == (0o755 if path.is_dir() else 0o644), (path, oct(mode))
        for path, (_, mode) in release.items():
            assert stat.S_IMODE(path.lstat().st_mode) == mode, path
        engine.revert(installed)
    finally:
        fs.replace = real_replace
        os.umask(old_umask)
    expected = {str(p): m for p, (_, m) in release.items()}
    expected[str(StateDir(site, "sglang").manifest_path)] = 0o644
    for path, mode in staged_modes:
        assert mode == expected.get(path, 0o644), (path, oct(mode))
    assert any(path.endswith("protocol.py") for path, _ in staged_modes)
    assert {p: (p.read_bytes(), stat.S_IMODE(p.lstat().st_mode)) for p in release} == release


# --------------------------------------------------------------------------------------------------
# bytecode


def _run_optimised(site: Path) -> bool:
    """Whether ``python -O`` importing the demo protocol module runs the patched code (a real process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = str(site)
    proc = subprocess.run(
        [sys.executable, "-O", "-c",
         "import sys; sys.dont_write_bytecode = True\n"
         "import sglang.srt.protocol as p; print(hasattr(p.Response, 'token_ids'))"],
        cwd=site, env=env, capture_output=True, text=True, check=True)
    return proc.stdout.strip() == "True"


def _cache_unchecked(source: Path, optimization: int | str) -> Path:
    """The bytecode of ``source`` as it is now, in an unchecked-hash .pyc: trusted without a look at
    the source (what `compileall --invalidation-mode unchecked-hash` and some distro packages write)."""
    cfile = importlib.util.cache_from_source(str(source), optimization=optimization)
    py_compile.compile(str(source), cfile=cfile, doraise=True, optimize=int(optimization or 0),
                       invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    return Path(cfile)


def test_apply_removes_stale_optimised_bytecode(tmp_path):
    site = demo_patches.make_engine_tree(tmp_path / "site")
    source = site / PROTOCOL
    stale = _cache_unchecked(source, 1)
    assert stale.name.endswith(".opt-1.pyc") and not _run_optimised(site)  # the release's code, from cache
    by_id.apply(load_source(site).as_installed(), ["demo"])
    assert _run_optimised(site)  # the patched code runs under -O
    assert not stale.exists()


def test_revert_removes_stale_optimised_bytecode(tmp_path):
    site = demo_patches.make_engine_tree(tmp_path / "site")
    installed = load_source(site).as_installed()
    by_id.apply(installed, ["demo"])
    stale = _cache_unchecked(site / PROTOCOL, 1)
    assert _run_optimised(site)
    engine.revert(installed)
    assert not _run_optimised(site)  # the release's code again under -O
    assert not stale.exists()


def test_every_cached_bytecode_of_a_replaced_file_goes_and_no_other(tmp_path):
    site = demo_patches.make_engine_tree(tmp_path / "site")
    srt = site / "sglang/srt"
    cache = srt / "__pycache__"
    cache.mkdir()
    stale = [cache / name for name in ("protocol.cpython-311.pyc", "protocol.cpython-311.opt-1.pyc",
                                       "protocol.cpython-311.opt-2.pyc", "protocol.cpython-312.opt-1.pyc",
                                       "protocol.pypy310.pyc")]
    stale.append(srt / "protocol.pyc")  # legacy, beside the source
    kept = [cache / name for name in ("protocol_v2.cpython-311.pyc", "protocol.extra.cpython-311.pyc",
                                      "__init__.cpython-311.opt-1.pyc")]
    kept.append(srt / "protocols.pyc")
    for path in stale + kept:
        path.write_bytes(b"old")
    installed = load_source(site).as_installed()
    by_id.apply(installed, ["demo"])
    assert [p for p in stale if p.exists()] == [] and all(p.exists() for p in kept)
    for path in stale:
        path.write_bytes(b"patched")
    engine.revert(installed)
    assert [p for p in stale if p.exists()] == [] and all(p.exists() for p in kept)


def test_the_release_wheel_cache_is_made_0755_whatever_the_umask(tmp_path, monkeypatch):
    """`repair` downloads the release's wheel into $TOOLKIT_CACHE_DIR/wheels: under umask 0 its folders
    were 0777 (Path.mkdir(parents=True)), so anyone could put a wheel there for the next repair."""
    from toolkit.engine.repair import pip_download

    monkeypatch.setenv("TOOLKIT_CACHE_DIR", str(tmp_path / "cache" / "toolkit"))
    no_pip = tmp_path / "python"
    no_pip.write_text("#!/bin/sh\necho 'no index here' >&2\nexit 1\n")
    no_pip.chmod(0o755)
    old_umask = os.umask(0)
    try:
        with pytest.raises(PatchError, match="could not download sglang==0.5.9"):
            pip_download(str(no_pip))("sglang", "0.5.9")
    finally:
        os.umask(old_umask)
    for folder in (tmp_path / "cache", tmp_path / "cache" / "toolkit", tmp_path / "cache" / "toolkit" / "wheels"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder
