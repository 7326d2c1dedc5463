"""Every patch distribution of this repository, used as a user would: each example package under
examples/ (one folder with a pyproject.toml each) and the catalog (catalog/, serving-toolkit-catalog,
one patch per RL framework fix), each wheel installed beside serving-toolkit in a folder of its own
put on PYTHONPATH (never into the dev venv, whose registry every other test reads).

* each distribution's own tests (golden, conformance, behaviour) pass against its installed wheel;

and for each patch a distribution registers:

* `toolkit list` shows it (only where it is installed), with its declared range and files;
* `toolkit matrix --offline` on the cached release trees declares exactly its releases, and there
  finds every anchor and passes the golden check;

and, per distribution and engine, every one of its patches at once (as a plain `toolkit apply-patch`
applies them with the package installed): on every release one of them declares, applied together
with every first-party patch that supports the release, each carries its marker and is `applied`, and
reverting all gives the release's bytes (tests/examples/all_applied.py, on the cached slim trees: no
server).

The wheels: scripts/test.sh's setup builds them into <cache>/example-wheels (scripts/example_wheels.py);
one that no longer matches its sources is built here. The behaviour on a real server is
test_clamp_max_tokens.py's (the one example whose fix shows on a CPU vLLM; see each example's README).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.harness.fixtures import REPO_ROOT, toolkit_cache_dir

sys.path.insert(0, str(REPO_ROOT / "scripts"))
import example_wheels  # noqa: E402  (scripts/ is no package)

QUICK = os.environ.get("TOOLKIT_QUICK") == "1"  # scripts/test.sh --quick (tests/conftest.py)
EXAMPLES = example_wheels.distributions()  # the examples and the catalog


def declared(example: Path) -> dict:
    project = tomllib.loads((example / "pyproject.toml").read_text())
    packages = project["tool"]["setuptools"]["packages"]  # a list, or {"find": {"include": [...]}} (the catalog)
    package = packages[0] if isinstance(packages, list) else packages["find"]["include"][0]
    return {"package": package.rstrip("*"), "dist": project["project"]["name"],
            "patches": project["project"]["entry-points"]["toolkit.patches"],
            "entry_points": project["project"]["entry-points"]}


def _wheel_matches_sources(wheel: Path, example: Path) -> bool:
    package = declared(example)["package"]
    sources = {p.relative_to(example).as_posix(): p.read_bytes() for p in (example / package).rglob("*.py")}
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        packaged = {n: archive.read(n) for n in names if n.startswith(f"{package}/") and n.endswith(".py")}
        points = next((archive.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt")), "")
    written = {group: dict(line.split(" = ", 1) for line in body.strip().splitlines())
               for group, _, body in (section.partition("]\n") for section in points.split("[")[1:])}
    return packaged == sources and written == declared(example)["entry_points"]


@pytest.fixture(scope="module")
def examples_dir(tmp_path_factory) -> Path:
    """One folder holding every installed example (``pip install --target``), for PYTHONPATH."""
    wheels = []
    for example in EXAMPLES:
        name = f"{declared(example)['dist'].replace('-', '_')}-*.whl"
        cached = [w for w in sorted((toolkit_cache_dir() / "example-wheels").glob(name))
                  if _wheel_matches_sources(w, example)]
        wheels.append(cached[0] if cached else example_wheels.build(example, tmp_path_factory.mktemp("wheels")))
    target = tmp_path_factory.mktemp("examples-installed")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    *map(str, wheels)], check=True, capture_output=True, text=True)
    return target


def run(examples_dir: Path | None, *args: str, cwd: Path | str = "/") -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    if examples_dir is not None:
        env["PYTHONPATH"] = str(examples_dir)
    return subprocess.run([sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=900)


def patch_of(example: Path, patch_id: str):
    """The ``PATCH`` registered as ``patch_id``, read from the sources (a declaration imports only
    toolkit.declare)."""
    module, _, name = declared(example)["patches"][patch_id].partition(":")
    sys.path.insert(0, str(example))
    try:
        return getattr(importlib.import_module(module), name)
    finally:
        sys.path.remove(str(example))


IDS = [e.name for e in EXAMPLES]
PATCHES = [(example, patch_id) for example in EXAMPLES for patch_id in declared(example)["patches"]]
PATCH_IDS = [patch_id for _, patch_id in PATCHES]


def test_there_are_the_worked_example_and_the_catalog_with_the_frameworks_fixes():
    # clamp_max_tokens is the worked example; the catalog holds the RL frameworks' fixes (catalog/README.md)
    assert {"clamp_max_tokens", "catalog"} <= set(IDS)
    assert {"kv-xfer-tolerate-freed", "sigquit-main-thread", "decode-drain-transferred",
            "ray-executor-v2-tcpstore-port"} <= set(declared(example_wheels.CATALOG)["patches"])


@pytest.mark.parametrize(("example", "patch_id"), PATCHES, ids=PATCH_IDS)
def test_toolkit_list_shows_it_only_where_it_is_installed(examples_dir, example, patch_id):
    patch = patch_of(example, patch_id)
    listed = run(examples_dir, "-m", "toolkit", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {(p["engine"], p["id"]): p for p in json.loads(listed.stdout)["patches"]}
    row = rows[(patch.engine, patch.id)]
    assert row["versions"] == patch.versions
    assert row["files"] == [edit.relpath for edit in patch.files]
    assert ("vllm", "tito") in rows  # serving-toolkit's own are still there
    alone = run(None, "-m", "toolkit", "list", "--json")
    assert patch.id not in {p["id"] for p in json.loads(alone.stdout)["patches"]}


@pytest.mark.slow
@pytest.mark.packaging  # runs a built package's own suite: CI, not the quick loop
@pytest.mark.parametrize("example", EXAMPLES, ids=IDS)
def test_its_own_tests_pass_against_the_installed_wheel(examples_dir, example, tmp_path):
    # cwd outside the sources: the tests import the wheel's package from PYTHONPATH
    result = run(examples_dir, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "--rootdir", str(example),
                 "-c", str(example / "pyproject.toml"), str(example / "tests"), cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]
    package = declared(example)["package"]
    imported = run(examples_dir, "-c", f"import {package}; print({package}.__file__)", cwd=tmp_path)
    assert imported.stdout.strip().startswith(str(examples_dir)), imported


@pytest.mark.parametrize(("example", "patch_id"), PATCHES, ids=PATCH_IDS)
def test_the_matrix_proves_it_on_every_release_it_declares_from_the_cached_trees(examples_dir, example, patch_id):
    from toolkit import releases

    patch = patch_of(example, patch_id)
    declared_releases = releases.releases_of(patch.engine, patch.versions)
    # --quick: the oldest and the newest release it declares, and one it does not where there is one (CI: all)
    chosen = sorted(set(releases.releases_of(patch.engine, ">=0")))
    if QUICK:
        undeclared = [r for r in chosen if r not in declared_releases]
        chosen = sorted({declared_releases[0], declared_releases[-1], *undeclared[-1:]})
    only = [arg for d, v in chosen for arg in ("--release", f"{d}=={v}")] if QUICK else []
    matrix = run(examples_dir, "-m", "toolkit", "matrix", patch.engine, "--patch", patch.id, "--offline", "--json", *only)
    assert matrix.returncode == 0, matrix.stdout[-3000:] + matrix.stderr[-3000:]
    cells = {(c["dist"], c["version"]): c for c in json.loads(matrix.stdout)["cells"]}
    assert set(cells) == set(chosen)
    proved = {release: c for release, c in cells.items() if c["declared"]}
    assert set(proved) == set(declared_releases) & set(chosen)
    assert all(c["golden"] == "ok" and c["anchors_found"] == c["anchors_total"] > 0 for c in proved.values()), proved


APPLIED_TOGETHER = [(example, engine) for example in EXAMPLES
                    for engine in sorted({patch_of(example, pid).engine for pid in declared(example)["patches"]})]


@pytest.mark.parametrize(("example", "engine"), APPLIED_TOGETHER, ids=[f"{e.name}-{g}" for e, g in APPLIED_TOGETHER])
def test_it_applies_with_every_first_party_patch_and_all_revert_byte_identically(examples_dir, example, engine):
    """Every patch of the distribution for ``engine`` at once (what a plain `toolkit apply-patch` applies
    with it installed), with toolkit's own, on every release one of them declares."""
    from toolkit import releases

    patches = [patch_of(example, pid) for pid in declared(example)["patches"]]
    patches = [p for p in patches if p.engine == engine]
    declared_by = {p.id: [f"{d}=={v}" for d, v in releases.releases_of(engine, p.versions)] for p in patches}
    # --quick: the oldest release any declares, the newest, and each patch on one release it declares (its
    # newest, where neither covers it): every patch applied together with the others at least once. CI: every one.
    known = [f"{d}=={v}" for d, v in releases.releases_of(engine, ">=0")]
    every = {r for rs in declared_by.values() for r in rs}
    chosen = {min(every, key=known.index), max(every, key=known.index)}
    for rs in declared_by.values():
        if not chosen & set(rs):
            chosen.add(rs[-1])
    only = sorted(chosen) if QUICK else None
    result = run(examples_dir, str(REPO_ROOT / "tests" / "examples" / "all_applied.py"), *(p.id for p in patches),
                 *(["--only", *only] if only else []), cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert set(report) == (set(only) if only else every)
    assert not {release: r["problems"] for release, r in report.items() if r["problems"]}, report
    for p in patches:  # each on every release it declares, with toolkit's own (tito supports every release)
        for release in declared_by[p.id]:
            if release not in report:
                continue  # --quick
            applied = report[release]["applied"]
            assert p.id in applied and "tito" in applied and len(applied) >= 3, (p.id, release, applied)
