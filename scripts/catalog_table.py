#!/usr/bin/env python3
"""Write the table of catalog/README.md from catalog/findings.toml and the fixes' declarations: one row
per RL framework fix that edits vLLM or SGLang source (framework, file, commit read, what it fixes,
releases, state, stale on). A ported row's releases and its "not needed" range are read from its ``PATCH``
(toolkit_catalog), so the table cannot drift from what the patch declares. The "stale on" column is a row's ``stale_on``:
the releases ``toolkit audit`` found the framework's copied function stale on (a list of DIST==VERSION,
empty when current on every release), or a string saying why there is nothing to audit; ``stale_note``
says what the copy drops or freezes (README.md says how the lists were computed).

``--check``: write nothing; exit 1 (one sentence) when README.md's table is not what this would write,
or when a row is malformed (a ported row naming no fix of the catalog, a fix of the catalog with no row).
"""

from __future__ import annotations

import argparse
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CATALOG = REPO / "catalog"
README = CATALOG / "README.md"
FINDINGS = CATALOG / "findings.toml"
BEGIN, END = "<!-- catalog-table -->", "<!-- /catalog-table -->"
STATES = ("ported", "not-needed", "cannot", "open")
FRAMEWORKS = ("prime-rl", "NeMo-RL", "verl", "slime", "SkyRL")


class TableError(Exception):
    pass


def _patches() -> dict:
    sys.path.insert(0, str(CATALOG))
    try:
        import toolkit_catalog

        return {patch.id: patch for patch in toolkit_catalog.patches()}
    finally:
        sys.path.remove(str(CATALOG))


def _releases(patch) -> str:
    from toolkit.releases import releases_of

    proved = releases_of(patch.engine, patch.versions)
    engine = {"vllm": "vLLM", "sglang": "SGLang"}[patch.engine]
    first, last = proved[0][1], proved[-1][1]
    text = f"{engine} {first}" if first == last else f"{engine} {first}-{last}"
    return f"{text} ({len(proved)} releases)" if len(proved) > 1 else text


def rows() -> list[list[str]]:
    findings = tomllib.loads(FINDINGS.read_text())["fix"]
    patches = _patches()
    out, ported = [], set()
    for fix in findings:
        state = fix.get("state")
        if state not in STATES or fix.get("framework") not in FRAMEWORKS:
            raise TableError(f"findings.toml: {fix.get('file')!r} has state {state!r} or framework "
                             f"{fix.get('framework')!r} (states: {', '.join(STATES)})")
        commit = f"`{fix['commit'][:10]}`"
        source = f"{fix['repo']} `{fix['file']}` ({fix['kind']})"
        if state == "ported":
            patch = patches.get(fix.get("patch", ""))
            if patch is None:
                raise TableError(f"findings.toml: {fix['file']!r} is ported as {fix.get('patch')!r}, "
                                 "which is no fix of the catalog")
            ported.add(patch.id)
            releases = _releases(patch)
            status = f"ported: `{patch.id}`"
            if patch.not_needed[0]:
                status += f"; not needed {patch.not_needed[0]}: {patch.not_needed[1]}"
        elif state == "not-needed":
            releases, status = fix["releases"], f"not needed since {fix['since']}"
        else:
            releases = fix["releases"]
            status = ("cannot be a codemod: " if state == "cannot" else "not ported yet: ") + fix["why"]
        out.append([fix["framework"], source, commit, fix["what"], releases, status, stale_cell(fix)])
    missing = sorted(set(patches) - ported)
    if missing:
        raise TableError(f"findings.toml has no ported row for the catalog's {', '.join(missing)}")
    return out


def _versions(dist: str, versions: list[str]) -> str:
    if len(versions) > 3:
        return f"{dist} {versions[0]}-{versions[-1]} ({len(versions)} releases)"
    return ", ".join(f"{dist} {version}" for version in versions)


def stale_cell(fix: dict) -> str:
    """The "stale on" cell: the releases the audit found the copy stale on, grouped by distribution
    (in the order written), then the note; or why there is no verdict."""
    stale, note = fix.get("stale_on"), fix.get("stale_note", "")
    if isinstance(stale, str) and stale:
        return stale + (f"; {note}" if note else "")
    if not isinstance(stale, list) or not all(isinstance(r, str) and r.count("==") == 1 for r in stale):
        raise TableError(f"findings.toml: {fix.get('file')!r} has stale_on {stale!r} (a list of DIST==VERSION, "
                         "or a string saying why there is no verdict)")
    if not fix.get("copy_sha256"):
        raise TableError(f"findings.toml: {fix.get('file')!r} has a verdict but no copy_sha256")
    from toolkit.kit._releases import LINES

    unknown = [release for release in stale if release.split("==")[0] not in LINES]
    if unknown:
        raise TableError(f"findings.toml: {fix.get('file')!r} is stale on {', '.join(unknown)}: no engine line "
                         f"of toolkit.releases ({', '.join(LINES)})")
    groups: dict[str, list[str]] = {}
    for release in stale:
        dist, version = release.split("==")
        groups.setdefault(dist, []).append(version)
    cell = ", ".join(_versions(dist, versions) for dist, versions in groups.items()) if stale else "none"
    return cell + (f": {note}" if note else "")


def table() -> str:
    body = rows()
    head = ["framework", "source", "commit read", "what it fixes", "releases", "state", "stale on"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in body]
    counts = {state: sum(1 for row in body if row[5].startswith(prefix)) for state, prefix in
              (("ported", "ported"), ("not needed", "not needed"), ("cannot", "cannot"), ("open", "not ported"))}
    summary = ", ".join(f"{n} {state}" for state, n in counts.items())
    return f"{len(body)} fixes of {len({row[0] for row in body})} frameworks: {summary}.\n\n" + "\n".join(lines) + "\n"


def render(readme: str) -> str:
    start, end = readme.find(BEGIN), readme.find(END)
    if start < 0 or end < start:
        raise TableError(f"{README.relative_to(REPO)} lost its {BEGIN} ... {END} markers")
    return readme[:start + len(BEGIN)] + "\n" + table() + readme[end:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when README.md's table is stale")
    args = parser.parse_args(argv)
    try:
        current = README.read_text()
        wanted = render(current)
    except (TableError, KeyError, tomllib.TOMLDecodeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.check:
        if wanted != current:
            print("error: catalog/README.md's table is stale: run scripts/catalog_table.py", file=sys.stderr)
            return 1
        return 0
    README.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
