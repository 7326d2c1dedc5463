"""``toolkit repair``: back to the installed release's files (sha256 from pip's RECORD), from the
backups when they verify, otherwise from the release wheel (injected here: a pristine tree), then the
state is cleared. Corrupt or missing manifest, missing or altered backups, a reinstall, and state left
behind by an uninstalled engine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from toolkit import api, cli
from toolkit.engine import patching as engine
from toolkit.errors import PatchError
from toolkit.engine.repair import repair
from toolkit.engine.sources import load_source

from tests.toolkit import demo_patches
from tests.harness import by_id


@pytest.fixture(autouse=True)
def demo_registry(monkeypatch):
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [demo_patches.DEMO, demo_patches.SECOND])


@pytest.fixture
def release(tmp_path) -> Path:
    """The release wheel's contents: what `pip download` would give."""
    release = demo_patches.make_engine_tree(tmp_path / "release")
    demo_patches.write_record(release)
    return release


@pytest.fixture
def site(tmp_path, release, monkeypatch) -> Path:
    site = tmp_path / "site"
    shutil.copytree(release, site)
    monkeypatch.setattr(api, "find_engines", lambda python=None: [load_source(site).as_installed()]
                        if (site / "sglang").exists() else [])
    import toolkit.engine.discovery

    monkeypatch.setattr(toolkit.engine.discovery, "site_dirs", lambda python=None: [site])
    return site


def pristine(site: Path, release: Path) -> bool:
    return all((site / "sglang" / r).read_bytes() == (release / "sglang" / r).read_bytes()
               for r in ("srt/serving.py", "srt/protocol.py"))


class Fetch:
    def __init__(self, release: Path) -> None:
        self.release, self.calls = release, 0

    def __call__(self, distribution: str, version: str) -> Path:
        assert (distribution, version) == ("sglang", "0.5.9")
        self.calls += 1
        return self.release


def installed(site: Path):
    return load_source(site).as_installed()


def states(site: Path) -> set[str]:
    return {row.state for row in engine.status(installed(site))}


@pytest.mark.parametrize("damage", ["manifest deleted", "manifest corrupt", "backups deleted", "backups altered",
                                    "manifest and backups deleted"])
def test_repair_puts_the_release_back_whatever_is_damaged(damage, site, release):
    by_id.apply(installed(site), ["demo", "second"])
    state = site / ".toolkit-state/sglang"
    if "manifest" in damage:
        if "corrupt" in damage:
            (state / "manifest.json").write_bytes(b"\x00garbage")
        else:
            (state / "manifest.json").unlink()
    if "backups deleted" in damage or "and backups" in damage:
        shutil.rmtree(state / "backups")
    if "altered" in damage:
        (state / "backups/srt/serving.py").write_text("# not the original\n")
    fetch = Fetch(release)
    result = repair(installed(site), fetch)
    assert pristine(site, release)
    assert not (state / "manifest.json").exists() and not (state / "backups").exists()
    assert states(site) == {"not applied"}
    from_backups = "backups" not in damage
    assert fetch.calls == (0 if from_backups else 1)
    assert set(result.restored) == {"srt/serving.py", "srt/protocol.py"}
    assert set(result.restored.values()) == ({"backup"} if from_backups else
                                             {"release"} if "deleted" in damage else {"backup", "release"})
    assert by_id.apply(installed(site), ["demo"]).changed  # usable again


@pytest.mark.parametrize("damage", ["deleted", "altered"])
def test_status_says_when_a_backup_cannot_restore_and_how_to_recover(damage, site, capsys):
    """Issue case 5: status no longer says `applied` over lost backups, and every refusal names `repair`."""
    by_id.apply(installed(site), ["demo"])
    backup = site / ".toolkit-state/sglang/backups/srt/serving.py"
    if damage == "deleted":
        backup.unlink()
    else:
        backup.write_text("# not the original\n")
    rows = {row.patch_id: row for row in engine.status(installed(site))}
    assert rows["demo"].state == "drifted" and "srt/serving.py" in rows["demo"].detail
    assert "toolkit repair" in rows["demo"].detail
    for argv in (["revert"], ["revert", "--force"], ["apply-patch", "--patch", "second"]):
        assert cli.main(argv) == 1
        assert "toolkit repair" in capsys.readouterr().err


def test_backups_that_do_not_verify_and_no_release_leave_everything_as_it_was(site, release):
    by_id.apply(installed(site), ["demo"])
    shutil.rmtree(site / ".toolkit-state/sglang/backups")
    before = {p: p.read_bytes() for p in site.rglob("*") if p.is_file()}
    bad_release = release.parent / "bad-release"
    shutil.copytree(release, bad_release)
    (bad_release / "sglang/srt/serving.py").write_text("# tampered\n")
    with pytest.raises(PatchError, match="RECORD"):
        repair(installed(site), Fetch(bad_release))
    assert {p: p.read_bytes() for p in site.rglob("*") if p.is_file() and p.name != "lock"} == \
        {p: b for p, b in before.items() if p.name != "lock"}


def test_reinstall_of_the_same_release_shows_drifted_and_repair_clears_the_state(site, release, capsys):
    by_id.apply(installed(site), ["demo"])
    shutil.copytree(release / "sglang", site / "sglang", dirs_exist_ok=True)  # pip install --force-reinstall
    assert states(site) == {"drifted", "not applied"}
    fetch = Fetch(release)
    result = repair(installed(site), fetch)
    assert result.restored == {} and result.cleared_state and fetch.calls == 0
    assert states(site) == {"not applied"} and not (site / ".toolkit-state/sglang/manifest.json").exists()


def test_cli_repair_and_orphan_state_after_uninstall(site, release, monkeypatch, capsys):
    monkeypatch.setattr("toolkit.engine.repair.pip_download", lambda python: Fetch(release))
    by_id.apply(installed(site), ["demo"])
    (site / ".toolkit-state/sglang/manifest.json").write_text("[]")
    assert cli.main(["repair"]) == 0
    out = capsys.readouterr().out
    assert "sglang 0.5.9: restored 2 file(s)" in out and pristine(site, release)
    assert cli.main(["repair", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["engines"]
    assert entry["restored"] == {} and not entry["cleared_state"]
    # pip uninstall: the package and its dist-info go, the state dir stays behind
    by_id.apply(installed(site), ["demo"])
    shutil.rmtree(site / "sglang")
    shutil.rmtree(site / "sglang-0.5.9.dist-info")
    assert cli.main(["repair", "--json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)["engines"]
    assert entry["orphan"] and entry["engine"] == "sglang"
    assert not (site / ".toolkit-state").exists()
    assert cli.main(["repair"]) == 0
    assert "nothing to repair" in capsys.readouterr().out


def test_repair_on_a_real_sglang_tree_with_its_real_record(tmp_path, monkeypatch):
    """The real RECORD and the unpacked release as the wheel, after the state was lost entirely."""
    from toolkit.patches.sglang.token_ids.patch import PATCH
    from tests.harness.fixtures import ensure_source_tree

    real = [PATCH]
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: real)
    source = ensure_source_tree("sglang", "0.5.23")
    site = tmp_path / "site"
    shutil.copytree(next(source.glob("*.dist-info")), site / next(source.glob("*.dist-info")).name)
    relpaths = [e.relpath for e in real[0].files]
    for relpath in relpaths:
        (site / "sglang" / relpath).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source / "sglang" / relpath, site / "sglang" / relpath)
    by_id.apply(installed(site), ["token-ids"])
    shutil.rmtree(site / ".toolkit-state")
    result = repair(installed(site), lambda dist, version: source)
    assert set(result.restored) == set(relpaths) and set(result.restored.values()) == {"release"}
    for relpath in relpaths:
        assert (site / "sglang" / relpath).read_bytes() == (source / "sglang" / relpath).read_bytes()
