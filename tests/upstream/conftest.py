"""tests/upstream holds engines' own test files, vendored (scripts/support/sglang_tests.py): data for
scripts/engine_own_tests.py, run by an engine venv's pytest on a copy, never collected by the toolkit's own;
and prime-rl/PINNED.json, facts (no code) about prime-rl's copied scheduler method, for toolkit audit's tests."""

collect_ignore_glob = ["*/**"]
