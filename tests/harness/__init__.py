"""Reusable pytest fixtures for tests that need engine venvs, engine sources, the tiny model or servers.

Load them from ``tests/conftest.py`` with ``pytest_plugins = ["tests.harness.fixtures"]``.
"""
