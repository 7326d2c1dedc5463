"""The release cache as documented: a matrix or conformance run keeps only slim trees (a release's
edited files and its METADATA); a wheel it downloads is deleted once the slim tree is cut. A wheel
already in the cache (scripts/fetch_sources.py's, which the test setup builds engine venvs from) stays.

Real pip downloads a real wheel, from a local folder (``PIP_FIND_LINKS``, ``PIP_NO_INDEX``: no network):
a stand-in SGLang 0.5.9 (one of the releases whose wheels used to be kept, 777 MB of them in issue 51)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tests.toolkit import demo_patches
from toolkit import matrix, patch_registry
from toolkit.kit import _releases as releases
from toolkit.testing import conformance_problems

RELEASE = ("sglang", "0.5.9")
WHEEL = "sglang-0.5.9-py3-none-any.whl"


@pytest.fixture
def index(tmp_path, monkeypatch) -> Path:
    """A package index of one wheel, and an empty release cache."""
    site = demo_patches.make_engine_tree(tmp_path / "build")
    (site / "sglang-0.5.9.dist-info" / "WHEEL").write_text("Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
    demo_patches.write_record(site)
    folder = tmp_path / "index"
    folder.mkdir()
    with zipfile.ZipFile(folder / WHEEL, "w") as wheel:
        for path in sorted(site.rglob("*")):
            if path.is_file():
                wheel.write(path, str(path.relative_to(site)))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    monkeypatch.setenv("TOOLKIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(patch_registry, "registry", lambda: [demo_patches.DEMO, demo_patches.SECOND])
    return folder


def cached_files(cache: Path) -> list[str]:
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file() and not p.name.startswith("."))


def assert_only_the_slim_tree(cache: Path) -> None:
    assert list(cache.rglob("*.whl")) == []
    assert cached_files(cache) == ["sources-slim/sglang-0.5.9/sglang-0.5.9.dist-info/METADATA",
                                   "sources-slim/sglang-0.5.9/sglang/srt/protocol.py",
                                   "sources-slim/sglang-0.5.9/sglang/srt/serving.py"]
    assert releases.slim_requested(releases.slim_dir(*RELEASE)) == {"srt/protocol.py", "srt/serving.py"}


def test_a_conformance_run_leaves_only_the_slim_tree(index):
    assert conformance_problems("demo", releases=[RELEASE]) == {"sglang==0.5.9": []}
    assert_only_the_slim_tree(releases.cache_dir())
    # the next run reads the slim tree: no download (the index is gone)
    (index / WHEEL).unlink()
    assert conformance_problems("second", releases=[RELEASE]) == {"sglang==0.5.9": []}


def test_a_matrix_run_leaves_only_the_slim_tree(index):
    cells = matrix.run(patch_registry.registry(), [RELEASE])
    assert {(c.patch, c.golden) for c in cells} == {("demo", "ok"), ("second", "ok")}
    assert_only_the_slim_tree(releases.cache_dir())


def test_a_wheel_already_cached_stays(index):
    wheels = releases.sources_dir() / "wheels"
    wheels.mkdir(parents=True)
    (wheels / WHEEL).write_bytes((index / WHEEL).read_bytes())  # as scripts/fetch_sources.py keeps it
    releases.ensure_slim(*RELEASE, ["srt/serving.py"])
    assert (wheels / WHEEL).is_file()
    assert releases.slim_requested(releases.slim_dir(*RELEASE)) == {"srt/serving.py"}


def test_a_matrix_reuses_the_slim_tree_a_patch_test_cut_with_its_files_alone(index):
    # issue 58: a patch's own test cut each release's slim tree with its one file, and `toolkit matrix`
    # then downloaded every wheel again to widen them to every registered patch's files
    releases.release_tree(*RELEASE, list(demo_patches.SECOND.relpaths))
    assert releases.slim_requested(releases.slim_dir(*RELEASE)) == {"srt/serving.py"}
    (index / WHEEL).unlink()  # a second download would fail
    cells = matrix.run([demo_patches.SECOND], [RELEASE])
    assert [(c.patch, c.golden, c.declared) for c in cells] == [("second", "ok", True)]
    assert releases.slim_requested(releases.slim_dir(*RELEASE)) == {"srt/serving.py"}  # as it was


def test_a_cut_the_matrix_makes_anyway_holds_every_registered_patchs_files(index):
    matrix.run([demo_patches.SECOND], [RELEASE])  # SECOND edits one file; the registry's patches two
    assert_only_the_slim_tree(releases.cache_dir())


def test_an_offline_read_during_another_runs_cut_waits_for_it_instead_of_saying_not_cached(index, monkeypatch):
    """The from-nothing CI run (2026-11-29): one worker widened a release's slim tree while another read it
    --offline; in the moment between the old tree's removal and the new one's rename the reader said "not in
    the cache". A reader that does not find what it needs looks again under the release's lock, which the
    cutting run holds until its tree is in place."""
    import threading

    slim = releases.ensure_slim(*RELEASE, ["srt/serving.py"])
    aside = slim.with_name(slim.name + ".being-cut")
    looked, outcome = threading.Event(), []
    unlocked_look = releases.slim_requested

    def slim_requested(path):
        found = unlocked_look(path)
        looked.set()
        return found

    def read_offline():
        try:
            outcome.append(releases.ensure_slim(*RELEASE, ["srt/serving.py"], offline=True))
        except Exception as exc:  # noqa: BLE001 - what the reader says is the test's result
            outcome.append(exc)

    monkeypatch.setattr(releases, "slim_requested", slim_requested)
    with releases.source_lock(*RELEASE):  # another run cutting the tree: its old tree gone, the new one not yet
        slim.rename(aside)
        reader = threading.Thread(target=read_offline)
        reader.start()
        assert looked.wait(30), "the reader never looked"
        aside.rename(slim)
    reader.join(30)
    assert outcome == [slim]
