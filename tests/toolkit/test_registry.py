"""The patch registry: every shipped patch is listed, and a patch's runtime module (imported inside
every engine process) loads neither libcst nor the patch engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.patch_registry import all_patches

REPO = Path(__file__).resolve().parents[2]
RUNTIME_MODULES = sorted({m for p in all_patches() for m in p.runtime_modules})


def test_every_patch_package_is_registered():
    declared = {"toolkit." + str(path.parent.relative_to(REPO)).replace("/", ".")
                for path in REPO.glob("patches/*/*/patch.py")}
    registered = {m for p in all_patches() for m in p.runtime_modules}
    assert declared and {m.rsplit(".", 1)[0] for m in registered} >= declared
    ids = [(p.engine, p.id) for p in all_patches()]
    assert len(ids) == len(set(ids))


def test_every_transformer_a_patch_names_loads():
    from toolkit.codemod import AnchoredTransformer

    for patch in all_patches():
        for edit in patch.files:
            loaded = edit.load_transformers()
            assert loaded and all(issubclass(t, AnchoredTransformer) for t in loaded), (patch.id, edit.relpath)


def _fake_distribution(site: Path, name: str, entry_points: str) -> None:
    info = site / f"{name.replace('-', '_')}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(entry_points)


def test_another_package_can_ship_a_patch_through_the_entry_point_group(tmp_path, monkeypatch):
    """A package that declares ``[toolkit.patches]`` in its entry points is found beside ours."""
    _fake_distribution(tmp_path, "thirdparty-patch", "[toolkit.patches]\ndemo = tests.toolkit.demo_patches:DEMO\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    patches = all_patches()
    assert ("sglang", "demo") in [(p.engine, p.id) for p in patches]
    assert patches[-1].id == "demo"  # this project's own come first


def test_other_packages_patches_come_by_id_whatever_the_order_distributions_are_listed_in(tmp_path, monkeypatch):
    """Two folders on the path, each holding a package's patch: whichever is listed first, the registry
    gives them by (engine, id), so the order patches tie in is the same on every machine."""
    first, second = tmp_path / "a", tmp_path / "b"
    _fake_distribution(first, "zeta-patch", "[toolkit.patches]\nsecond = tests.toolkit.demo_patches:SECOND\n")
    _fake_distribution(second, "alpha-patch", "[toolkit.patches]\ndemo = tests.toolkit.demo_patches:DEMO\n")
    seen = []
    for order in ((first, second), (second, first)):
        with monkeypatch.context() as patched:
            for folder in reversed(order):
                patched.syspath_prepend(str(folder))
            seen.append([p.id for p in all_patches()][-2:])
    assert seen == [["demo", "second"], ["demo", "second"]]


def test_a_distribution_installed_later_is_found_on_the_next_call(tmp_path, monkeypatch):
    """A distribution installed into a folder on the path is found on the next call."""
    monkeypatch.syspath_prepend(str(tmp_path))
    assert ("sglang", "demo") not in [(p.engine, p.id) for p in all_patches()]
    _fake_distribution(tmp_path, "late-patch", "[toolkit.patches]\ndemo = tests.toolkit.demo_patches:DEMO\n")
    assert ("sglang", "demo") in [(p.engine, p.id) for p in all_patches()]


def test_every_command_reads_the_registry_once_at_its_edge(site, monkeypatch, capsys):
    """The patch ids a user writes are resolved to patches once (``patch_registry.select``) and the
    objects go down: no command reads the registry twice (it was asked ~12 times per apply, and a
    cache over every ``sys.path`` entry's mtime stood in for that; now nothing is remembered)."""
    from tests.toolkit import demo_patches
    from toolkit import cli, patch_registry

    demo_patches.write_record(site)
    reads = []
    monkeypatch.setattr(patch_registry, "registry",
                        lambda: reads.append(1) or [demo_patches.DEMO, demo_patches.SECOND])
    commands = [["list"], ["apply-patch", "--patch", "demo"], ["apply-patch"], ["status", "-v"],
                ["apply-patch", "--dry-run", "--diff"], ["revert", "--patch", "second"], ["revert"], ["repair", "-v"],
                ["check", "--source", str(site)], ["check", "--source", str(site), "--patch", "demo"],
                ["apply-patch", "--patch", "demo", "--json"], ["status", "--json"], ["revert", "--json"]]
    for argv in commands:
        reads.clear()
        assert cli.main(argv) == 0, (argv, capsys.readouterr())
        assert len(reads) == 1, argv
    capsys.readouterr()


def test_the_registry_reads_what_is_installed_on_every_call(monkeypatch):
    """Nothing is remembered between calls: each call reads the entry points once."""
    from importlib import metadata

    reads = []
    real = metadata.entry_points

    def counting(**params):
        reads.append(params)
        return real(**params)

    monkeypatch.setattr(metadata, "entry_points", counting)
    first = all_patches()
    first.clear()  # a caller's copy
    assert all_patches() == all_patches() != []
    assert len(reads) == 3


def test_two_packages_declaring_one_patch_id_is_an_error(tmp_path, monkeypatch):
    from toolkit.errors import RegistryError

    _fake_distribution(tmp_path, "one-patch", "[toolkit.patches]\ndemo = tests.toolkit.demo_patches:DEMO\n")
    (tmp_path / "other_demo.py").write_text(
        "import dataclasses\nfrom tests.toolkit.demo_patches import SECOND\nPATCH = dataclasses.replace(SECOND, id='demo')\n")
    _fake_distribution(tmp_path, "other-patch", "[toolkit.patches]\ndemo = other_demo:PATCH\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RegistryError, match="two entry points declare sglang patch demo"):
        all_patches()


def test_a_patch_that_does_not_load_is_named(tmp_path, monkeypatch):
    from toolkit.errors import RegistryError

    _fake_distribution(tmp_path, "broken-patch", "[toolkit.patches]\nbroken = no_such_module_here:PATCH\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(RegistryError, match="broken = no_such_module_here:PATCH does not load"):
        all_patches()


def test_the_cli_names_a_broken_patch_entry_point_in_one_sentence(tmp_path, monkeypatch, capsys):
    """Another package's broken entry point is that package's fault: exit 1 and its name, not "internal error"."""
    from toolkit import cli

    _fake_distribution(tmp_path, "broken-patch", "[toolkit.patches]\nbroken = no_such_module_here:PATCH\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("TOOLKIT_DEBUG", raising=False)
    assert cli.main(["list"]) == 1
    err = capsys.readouterr().err.strip()
    assert "broken = no_such_module_here:PATCH does not load" in err and "internal error" not in err, err
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err


# Inside an engine process only the package's light front door and the patch's own modules may load.
ALLOWED_IN_ENGINE = ("toolkit", "toolkit.base", "toolkit.base.version", "toolkit.base.lazy", "toolkit.patches")  # the front door, stdlib only


@pytest.mark.parametrize("module", RUNTIME_MODULES)
def test_runtime_module_imports_nothing_of_the_patch_engine(module):
    code = (
        "import importlib, json, sys; importlib.import_module(%r); "
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('libcst', 'toolkit'))))" % module
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    engine_side = [m for m in loaded if m not in ALLOWED_IN_ENGINE and not m.startswith("toolkit.patches.")]
    assert engine_side == [], engine_side


def test_versions_are_one_range_with_an_upper_bound():
    from toolkit.declare import Patch

    def declare(versions):
        return Patch(id="p", engine="sglang", versions=versions, files=(), summary="")

    proved = declare(">=0.5.9,<=0.5.23")
    assert [proved.supports(v) for v in ("0.5.8", "0.5.9", "0.5.15.post1", "0.5.23")] == [False, True, True, True]
    # versions as users have them: a local build tag of a release proved, a post release of one
    assert all(proved.supports(v) for v in ("0.5.23+cpu", "0.5.12+cu129", "0.5.23.post1", "0.5.23.post2+cu129"))
    # newer than the newest release proved, any dev build or release candidate, not PEP 440: refused
    assert not any(proved.supports(v) for v in ("0.5.24", "0.5.24.post1", "0.5.24rc1", "0.6.0", "0.5.15.custom-build",
                                                "0.5.23rc1", "0.5.20.dev0+g1a2b3c4", "0.5.8.post1"))
    with pytest.raises(TypeError, match="one range"):
        declare(("==0.5.9", "==0.5.23"))
    with pytest.raises(ValueError, match="no upper bound"):
        declare(">=0.5.9")


def test_toolkit_list_shows_each_patch_range():
    out = subprocess.run([sys.executable, "-m", "toolkit", "list", "--json"], capture_output=True, text=True,
                         check=True, cwd=REPO).stdout
    listed = json.loads(out)
    assert listed["schema"] == 1 and listed["ok"] is True
    rows = {(row["engine"], row["id"]): row["versions"] for row in listed["patches"]}
    assert rows == {(p.engine, p.id): p.versions for p in all_patches()}
    assert all(isinstance(v, str) and v[:2] in (">=", "==") for v in rows.values())
