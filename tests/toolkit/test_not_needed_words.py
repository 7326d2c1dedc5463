"""A release a patch declares ``not_needed`` (fixed upstream) is said to be that, in every command that
shows releases (issue 58): ``check --source`` (not "needs --allow-unknown-version", and a ``not_needed``
field under ``--json``), ``toolkit list`` (the range beside the proved one) and ``toolkit matrix``
("not needed", not a plain "no")."""

from __future__ import annotations

import io
import json

from rich.console import Console

from toolkit.kit import _matrix as matrix
from toolkit.engine.sources import load_source

from tests.toolkit import demo_patches
from tests.toolkit.test_bad_input import run
from tests.toolkit.test_cli_words import BUILTIN, registry, site  # noqa: F401  (the fixtures)


def test_check_on_a_not_needed_release_says_so_not_the_flag(site, capsys):  # noqa: F811
    code, out, _ = run(capsys, "check", "--source", str(site), "--patch", "built-in")
    verdict = next(line for line in out.splitlines() if line.startswith("built-in:"))
    assert "not needed on this release: the engine serves this itself" in verdict, verdict
    assert "allow-unknown-version" not in verdict and "not proved" not in verdict
    code, out, _ = run(capsys, "check", "--source", str(site), "--patch", "built-in", "--patch", "demo", "--json")
    rows = {row["patch"]: row for row in json.loads(out)["patches"]}
    assert rows["built-in"]["not_needed"].startswith("the engine serves this itself")
    assert rows["built-in"]["supported_version"] is False
    assert rows["demo"]["not_needed"] == "" and rows["demo"]["supported_version"] is True


def test_list_shows_the_not_needed_range_without_verbose(capsys):
    code, out, _ = run(capsys, "list", "sglang")
    assert code == 0
    built_in = out[out.index("built-in"):].split("│ second", 1)[0]
    assert "not needed: >=0.5.9" in built_in
    demo = out[out.index("│ demo"):].split("\n", 2)[:2]
    assert "not needed" not in "".join(demo)


def test_matrix_says_not_needed_where_the_patch_declares_it(site):  # noqa: F811
    cells = matrix.evaluate(load_source(site), [BUILTIN, demo_patches.DEMO])
    by_id = {c.patch: c for c in cells}
    assert by_id["built-in"].not_needed.startswith("the engine serves") and not by_id["built-in"].declared
    assert by_id["demo"].not_needed == "" and by_id["demo"].declared
    console = Console(file=io.StringIO(), width=300)
    matrix.print_table(console, cells)
    rows = {line.split("│")[2].strip(): line.split("│")[3].strip()
            for line in console.file.getvalue().splitlines() if line.startswith("│")}
    assert rows == {"built-in": "not needed", "demo": "yes"}
    assert matrix.problems(cells) == []  # not needed is no failure
