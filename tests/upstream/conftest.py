"""tests/upstream holds engines' own test files, vendored (scripts/support/sglang_tests.py): data for
scripts/engine_own_tests.py, run by an engine venv's pytest on a copy, never collected by the toolkit's own."""

collect_ignore_glob = ["*/**"]
