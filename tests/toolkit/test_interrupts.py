"""Issue 29's small data-safety items beside the fault suite: a signal the program's own handler
swallows, a failed rename, a repair stopped at its last step, a manifest with a timestamp no float
holds, a cache folder under a user who does not exist, and a patch the engine does not need."""

from __future__ import annotations

import errno
import json
import os
import signal
import threading
from pathlib import Path

import pytest

from toolkit import cli
from toolkit.engine import patching as engine, fs, interrupts
from toolkit.declare import Patch
from toolkit.errors import PatchError
from toolkit.engine.sources import load_source
from toolkit.engine.state import StateDir

from tests.toolkit import demo_patches
from tests.harness import by_id

pytestmark = pytest.mark.usefixtures("demo_registry")


def _files(site: Path) -> dict[str, bytes]:
    return {str(p.relative_to(site)): p.read_bytes() for p in sorted((site / "sglang").rglob("*.py"))}


def _temps(site: Path) -> list[Path]:
    return [p for p in site.rglob("*") if p.name.endswith(fs.TEMP_SUFFIX)]


def test_a_signal_whose_handler_does_not_stop_still_rolls_back(site, monkeypatch):
    """A launcher's own SIGINT handler that only sets a flag: the write stops at its next safe point,
    every file comes back, the handler runs once, and the API says so in a sentence."""
    before = _files(site)
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    monkeypatch.setattr("toolkit.engine.journal._after_file_write", lambda relpath: os.kill(os.getpid(), signal.SIGINT))
    try:
        with pytest.raises(PatchError, match="interrupted by SIGINT; every file was put back"):
            by_id.apply(load_source(site).as_installed(), ["demo"])
    finally:
        signal.signal(signal.SIGINT, previous)
    assert seen == [signal.SIGINT] and _files(site) == before and _temps(site) == []
    assert not StateDir(site, "sglang").manifest_path.exists()
    assert not StateDir(site, "sglang").backup_root.exists()


def test_signals_are_left_alone_outside_the_main_thread(site):
    """Only the main thread may set handlers: elsewhere the write runs with nothing held."""
    handler = signal.getsignal(signal.SIGINT)
    errors: list[BaseException] = []

    def apply() -> None:
        try:
            by_id.apply(load_source(site).as_installed(), ["demo"])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    thread = threading.Thread(target=apply)
    thread.start()
    thread.join()
    assert errors == [] and signal.getsignal(signal.SIGINT) is handler
    assert {r.state for r in engine.status(load_source(site).as_installed())} == {"applied", "not applied"}


def test_held_gives_back_the_handlers_it_found():
    before = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    with interrupts.held() as holder:
        assert all(signal.getsignal(s) == holder.note for s in interrupts.SIGNALS if before[s] is not signal.SIG_IGN)
    assert {s: signal.getsignal(s) for s in interrupts.SIGNALS} == before


def test_a_failed_rename_leaves_no_temp_file_and_names_the_engine_file(site, monkeypatch):
    """os.replace names its source (the temp file) in the error: the message must name the engine file."""
    before = _files(site)
    real_replace = fs.replace

    def replace(src, dst):
        if str(dst) == str(site / "sglang/srt/serving.py"):
            raise OSError(errno.EPERM, os.strerror(errno.EPERM), str(src), None, str(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(fs, "replace", replace)
    with pytest.raises(PatchError) as raised:
        by_id.apply(load_source(site).as_installed(), ["demo"])
    message = str(raised.value)
    assert "cannot replace" in message and message.split(": ")[0].endswith("srt/serving.py")
    assert fs.TEMP_SUFFIX not in message
    assert _temps(site) == [] and _files(site) == before


def test_repair_killed_at_its_last_step_leaves_status_true(tmp_path):
    """Kill a revert mid-way, then a repair just before it removes the manifest (its commit): every file
    is the release's, and status says an interrupted revert, never "drifted"; a revert then finishes."""
    from toolkit.engine.repair import repair

    site = demo_patches.make_engine_tree(tmp_path / "site")
    demo_patches.write_record(site)
    release = _files(site)
    installed = load_source(site).as_installed()
    by_id.apply(installed, ["demo", "second"])
    state = StateDir(site, "sglang")
    pid = os.fork()
    if pid == 0:  # repair, SIGKILLed at the unlink of the manifest
        real_unlink = fs.unlink

        def unlink(path):
            if Path(path) == state.manifest_path:
                os.kill(os.getpid(), signal.SIGKILL)
            real_unlink(path)

        fs.unlink = unlink
        try:
            repair(installed, lambda dist, version: site)
        finally:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and _files(site) == release
    rows = engine.status(installed)
    assert {r.state for r in rows} == {"partial"}, [(r.patch_id, r.state, r.detail) for r in rows]
    assert all(r.detail.startswith("a revert was interrupted") for r in rows)
    engine.revert(installed)
    assert {r.state for r in engine.status(installed)} == {"not applied"} and _files(site) == release
    assert not state.root.joinpath("manifest.json").exists() and not state.backup_root.exists()


@pytest.mark.parametrize("updated_at", ["1e400", "9" * 400, "-1e999", "true", '"yesterday"'])
def test_a_timestamp_no_float_holds_breaks_nothing(site, capsys, updated_at):
    """updated_at of 10**400 raised OverflowError in every command ("internal error")."""
    installed = load_source(site).as_installed()
    by_id.apply(installed, ["demo"])
    manifest = StateDir(site, "sglang").manifest_path
    manifest.write_text(manifest.read_text().replace('"updated_at": ', f'"updated_at": {updated_at}, "was": '))
    assert {r.state for r in engine.status(installed)} == {"applied", "not applied"}
    assert cli.main(["status", "--json"]) == 0
    assert cli.main(["revert"]) == 0
    assert {r.state for r in engine.status(installed)} == {"not applied"}


def test_repair_with_a_cache_folder_of_an_unknown_user(monkeypatch):
    from toolkit.engine.repair import pip_download

    monkeypatch.setenv("TOOLKIT_CACHE_DIR", "~nosuchuser29/x")
    with pytest.raises(PatchError, match="names a home folder that does not exist"):
        pip_download("python")("sglang", "0.5.9")


def test_a_patch_the_engine_does_not_need_is_never_written(site, monkeypatch, capsys):
    """A release that serves the feature itself (a plugin entry point): naming the patch says why it is
    not needed, writes nothing, and never advises --allow-unknown-version; without --patch it is skipped;
    named with allow_unknown_version it is tried, as any patch outside its range."""
    served = Patch(id="served", engine="sglang", versions=">=0.5.0,<=0.5.10", files=demo_patches.DEMO.files,
                   summary="served by a plugin from 0.5.9", not_needed=(">=0.5.9", "the plugin serves it"))
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [demo_patches.DEMO, served])
    before = _files(site)
    installed = load_source(site).as_installed()
    with pytest.raises(PatchError) as raised:
        by_id.apply(installed, ["served"])
    assert "not needed on sglang 0.5.9: the plugin serves it" in str(raised.value)
    assert "allow" not in str(raised.value)
    assert _files(site) == before
    # every patch, even with allow_unknown_version: the unneeded one is left out
    assert engine.apply(installed, allow_unknown_version=True).patches == ["demo"]
    engine.revert(installed)
    # named and "try anyway": it is tried (the compatibility matrix checks its anchors on every release)
    assert by_id.apply(installed, ["served"], allow_unknown_version=True).patches == ["served"]
    engine.revert(installed)
    by_id.apply(installed, ["demo"])
    capsys.readouterr()
    assert cli.main(["status", "--json"]) == 0
    rows = {r["patch_id"]: r for r in json.loads(capsys.readouterr().out)["patches"]}
    assert rows["served"]["state"] == "not applied" and rows["demo"]["state"] == "applied"


def test_the_real_superlinear_backend_is_not_needed_where_the_plugin_serves_it():
    from toolkit.patches.sglang.superlinear_backend.patch import PATCH

    assert PATCH.not_needed_on("0.5.9") == "" and PATCH.not_needed_on("0.5.10") == ""
    assert "plugin entry point" in PATCH.not_needed_on("0.5.11")
    assert "plugin entry point" in PATCH.not_needed_on("0.5.23")
