"""The check names the command line lists without loading a check are the checks verify runs."""

from __future__ import annotations

import subprocess
import sys

from tests.architecture.import_graph import REPO


def test_names_are_every_check_in_order():
    from toolkit.verify.checks import NAMES
    from toolkit.verify.checks.suite import all_checks

    assert NAMES == tuple(check.name for check in all_checks())


def test_reading_the_names_loads_no_check():
    code = ("import sys; from toolkit.verify.checks import NAMES; "
            "print(sorted(m for m in sys.modules if m.startswith('toolkit.verify.checks.') or m == 'httpx'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
