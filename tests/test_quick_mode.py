"""`scripts/test.sh --quick` (TOOLKIT_QUICK=1): the same tests, fewer drawn examples (tests/conftest.py)."""

from __future__ import annotations


def test_quick_mode_draws_at_most_ten_examples_and_ci_all(monkeypatch):
    """tests/conftest.py: `scripts/test.sh --quick` caps each property test's examples; CI does not."""
    from types import SimpleNamespace

    from hypothesis import given, settings, strategies as st

    import tests.conftest as root

    def make():
        drawn = []

        @settings(max_examples=40, database=None)
        @given(st.integers())
        def prop(x):
            drawn.append(x)

        return prop, drawn

    for quick, expected in ((True, root.QUICK_EXAMPLES), (False, 40)):
        monkeypatch.setattr(root, "QUICK", quick)
        prop, drawn = make()
        root.pytest_collection_modifyitems(None, [SimpleNamespace(obj=prop), SimpleNamespace(obj=None)])
        prop()
        assert len(drawn) == expected
