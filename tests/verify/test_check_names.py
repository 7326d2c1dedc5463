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


def test_a_check_name_is_resolved_once_and_refused_in_one_sentence(monkeypatch, tmp_path):
    """``verify`` resolves its names once (``suite.select_checks``) and hands Check objects on: an unknown
    name is refused there, before any model or server, as a usage error (a ValueError too, as
    ``run_checks`` raised before)."""
    import pytest

    from toolkit.errors import UsageError
    from toolkit.verify import run as verify_run
    from toolkit.verify.checks import suite

    calls = []
    real = suite.select_checks

    def counted(*args, **kwargs):
        calls.append(args[0] if args else kwargs.get("names"))
        return real(*args, **kwargs)

    monkeypatch.setattr(verify_run, "select_checks", counted)
    with pytest.raises(UsageError, match=r"unknown check\(s\): multi-trun .*; did you mean multi-turn\?"):
        verify_run.verify(str(tmp_path / "no-model"), checks=["multi-trun"])
    assert calls == [["multi-trun"]]
    with pytest.raises(ValueError, match=r"unknown check\(s\): nope"):
        suite.run_checks(None, ["nope"])  # type: ignore[arg-type]  (refused before the target is read)
    assert [c.name for c in real(["multi-turn", "stream-parity"])] == ["stream-parity", "multi-turn"]  # run order
