"""Shared fixtures (engine venvs, engine sources, the tiny model, the SGLang CPU shim) live in
tests/harness/fixtures.py; every test folder sees them through this plugin line."""

pytest_plugins = ["tests.harness.fixtures"]
