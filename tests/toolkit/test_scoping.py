"""A command acts on what it names: ``--patch ID`` on that patch only, an id of another engine is a
usage error, ``revert --force --patch X`` overwrites only files X edits, messages name flags that
exist, and a file that comes back keeps (or gets) an ordinary mode."""

from __future__ import annotations

import json
import os

import pytest

from toolkit import api, cli
from toolkit.engine import patching as engine
from toolkit.codemod import FileEdit, Patch
from toolkit.errors import DriftError, UsageError
from toolkit.engine.sources import load_source

from tests.toolkit import demo_patches
from tests.harness import by_id

VLLM_ONLY = Patch("vllm-only", "vllm", ">=0,<1", (FileEdit("srt/protocol.py", (demo_patches.AddFieldToResponse,)),),
                  "a patch of the other engine")


@pytest.fixture(autouse=True)
def demo_registry(monkeypatch):
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [demo_patches.DEMO, demo_patches.SECOND, VLLM_ONLY])


@pytest.fixture
def site(tmp_path, monkeypatch):
    site = demo_patches.make_engine_tree(tmp_path / "site")
    monkeypatch.setattr(api, "find_engines", lambda python=None: [load_source(site).as_installed()])
    return site


def run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def states(site) -> dict[str, str]:
    return {row.patch_id: row.state for row in engine.status(load_source(site).as_installed())}


def test_patch_of_another_engine_is_a_usage_error_and_changes_nothing(site, capsys):
    for verb in ("apply-patch", "revert"):
        code, _, err = run(capsys, verb, "sglang", "--patch", "vllm-only")
        assert code == 2 and "not a patch of sglang: vllm-only is vllm's" in err
    with pytest.raises(UsageError, match="not a patch of sglang"):
        api.apply_patch(engine="sglang", patches=["vllm-only"])
    with pytest.raises(UsageError, match="not a patch of sglang"):
        api.revert_patch(engine="sglang", patches=["vllm-only"])
    assert set(states(site).values()) == {"not applied"}


def test_patch_flag_applies_that_patch_only(site, capsys):
    code, out, _ = run(capsys, "apply-patch", "sglang", "--patch", "second", "--json")
    assert code == 0 and json.loads(out)["engines"][0]["applied_patches"] == ["second"]
    assert states(site) == {"demo": "not applied", "second": "applied"}
    assert api.apply_patch(engine="sglang", patches=["demo"])
    assert states(site)["demo"] == "applied"
    assert api.revert_patch(engine="sglang", patches=["second"])
    assert states(site) == {"demo": "applied", "second": "not applied"}


def test_revert_force_of_one_patch_touches_only_the_files_it_edits(site, capsys):
    """Issue case 6: a hand edit in a file only another patch edits survives `revert --force --patch X`."""
    run(capsys, "apply-patch", "--patch", "demo", "--patch", "second")
    protocol = site / "sglang/srt/protocol.py"  # edited by demo only
    protocol.write_text(protocol.read_text() + "# hand edit\n")
    code, _, _ = run(capsys, "revert", "--force", "--patch", "second")
    assert code == 0
    assert protocol.read_text().endswith("# hand edit\n")
    serving = (site / "sglang/srt/serving.py").read_text()
    assert "# toolkit:demo" in serving and "# toolkit:second" not in serving
    assert states(site)["second"] == "not applied" and states(site)["demo"] == "drifted"


def test_drift_messages_name_flags_that_exist(site, capsys):
    """Issue case 7: the message suggests `--force` for the very command that refused, and it parses."""
    run(capsys, "apply-patch", "--patch", "demo")
    serving = site / "sglang/srt/serving.py"
    serving.write_text(serving.read_text() + "# hand edit\n")
    installed = load_source(site).as_installed()
    (site / ".toolkit-state/sglang/manifest.json").read_text()
    with pytest.raises(DriftError, match=r"`toolkit apply-patch --force`, apply_patch\(force=True\) in Python"):
        by_id.apply(installed, ["demo", "second"])
    with pytest.raises(DriftError, match=r"`toolkit revert --force`, revert_patch\(force=True\) in Python"):
        engine.revert(installed)
    code, _, _ = run(capsys, "apply-patch", "--patch", "second", "--force")
    assert code == 0 and states(site) == {"demo": "applied", "second": "applied"}
    assert not serving.read_text().endswith("# hand edit\n")


def test_deleted_file_restored_by_revert_force_comes_back_0644(site, capsys):
    """Issue case 8: whatever the umask, a file that was missing comes back as an ordinary 0644 file."""
    run(capsys, "apply-patch", "--patch", "demo")
    serving = site / "sglang/srt/serving.py"
    serving.unlink()
    old = os.umask(0o077)
    try:
        code, _, _ = run(capsys, "revert", "--force")
    finally:
        os.umask(old)
    assert code == 0 and serving.read_text() == demo_patches.SERVING
    assert serving.stat().st_mode & 0o777 == 0o644


def test_reinstall_of_the_same_release_is_drifted_not_partial(site, capsys):
    """Issue case 9: `pip install --force-reinstall` of the same release puts the original files back
    under an `applied` manifest: that is drift (nothing was interrupted), and apply patches again."""
    run(capsys, "apply-patch", "--patch", "demo")
    (site / "sglang/srt/serving.py").write_text(demo_patches.SERVING)
    (site / "sglang/srt/protocol.py").write_text(demo_patches.PROTOCOL)
    rows = {row.patch_id: row for row in engine.status(load_source(site).as_installed())}
    assert rows["demo"].state == "drifted" and "reinstalled" in rows["demo"].detail
    assert run(capsys, "apply-patch", "--patch", "demo")[0] == 0
    assert states(site)["demo"] == "applied"


def test_status_says_when_the_engine_cannot_import_our_runtime(tmp_path, monkeypatch):
    """A patched engine whose environment lost this project (``pip uninstall`` without a revert): status
    says so, names both ways out, and exits 1; with the runtime there at this version it is ``applied``."""
    import dataclasses

    from tests.toolkit import demo_patches
    from toolkit.engine import patching as engine
    from toolkit.engine.sources import load_source
    from toolkit.base.version import __version__

    with_runtime = dataclasses.replace(demo_patches.DEMO, runtime_modules=("toolkit.patches.demo.runtime",))  # ours
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [with_runtime])
    site = demo_patches.make_engine_tree(tmp_path / "site")
    installed = load_source(site).as_installed()
    by_id.apply(installed, ["demo"])
    states = {r.patch_id: r.state for r in engine.status(dataclasses.replace(installed, toolkit_version=__version__))}
    assert states == {"demo": "applied"}
    (row,) = engine.status(dataclasses.replace(installed, toolkit_version=""))
    assert row.state == "runtime missing"
    assert "no serving-toolkit" in row.detail and "pip install" in row.detail and "toolkit revert" in row.detail
