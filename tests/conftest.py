"""Shared fixtures (engine venvs, engine sources, the tiny model, the SGLang CPU shim) live in
tests/harness/fixtures.py; every test folder sees them through this plugin line. tests/harness/phases.py
times each folder; tests/harness/workers.py gives each parallel (xdist) worker its own engine venvs."""

pytest_plugins = ["tests.harness.fixtures", "tests.harness.workers", "tests.harness.phases"]

import sys as _sys

# This machine's image sets PYTHONDONTWRITEBYTECODE=1, so each worker of every run rewrote (pytest's assertion
# rewriting) and compiled all ~250 test modules again: about 8 s of a worker's 12 s collection. Collection
# writes their bytecode (tests/**/__pycache__, and the checkout's modules the tests import at module level:
# ignored by git) and every later run reads it; the tests themselves run with the machine's setting
# (pytest_collection_finish), so no import during a test leaves a __pycache__ in a tree a test compares.
_DONT_WRITE_BYTECODE = _sys.dont_write_bytecode
_sys.dont_write_bytecode = False


def pytest_collection_finish(session):
    _sys.dont_write_bytecode = _DONT_WRITE_BYTECODE


try:
    from hypothesis import HealthCheck, settings
except ImportError:  # an engine venv running a single test file
    pass
else:
    # Property tests judge results, never speed: on a loaded 2-core machine an example may take seconds,
    # so no deadline and no "too slow" health check, whatever a test's own @settings leave unset.
    settings.register_profile("toolkit", deadline=None,
                              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    settings.load_profile("toolkit")

# Tests deliver SIGINT (Ctrl-C) to toolkit processes. A run started as a background job of a
# non-interactive shell inherits SIGINT ignored, and so would every process it starts: give this one
# Python's own handler (forked children keep it, exec'd ones start with the default again).
import signal as _signal

if _signal.getsignal(_signal.SIGINT) is _signal.SIG_IGN:
    _signal.signal(_signal.SIGINT, _signal.default_int_handler)


import os as _os

import pytest as _pytest


@_pytest.fixture(autouse=True)
def _codemod_results_per_test():
    """The patch engine remembers codemod results in-process (toolkit/engine/transform.py); each test starts
    with none, so a test that changes a transformer in place never sees another test's results."""
    transform = _sys.modules.get("toolkit.engine.transform")
    if transform is not None:
        transform.forget()
    yield


# `scripts/test.sh --quick` (TOOLKIT_QUICK=1), the loop run after every change: the same tests with
# fewer drawn examples: each property test draws at most QUICK_EXAMPLES, and the fault suite faults a
# sample of the calls (tests/toolkit/test_faults.py: every 14th over the real engine trees, every third one
# over the demo tree). CI runs them all.
QUICK = _os.environ.get("TOOLKIT_QUICK") == "1"
QUICK_EXAMPLES = 5


def pytest_collection_modifyitems(config, items):
    if not QUICK:
        return
    try:
        from hypothesis import settings
    except ImportError:
        return
    for item in items:
        test = getattr(item, "obj", None)
        current = getattr(test, "_hypothesis_internal_use_settings", None)  # where @given keeps its settings
        if current is not None and current.max_examples > QUICK_EXAMPLES:
            test._hypothesis_internal_use_settings = settings(current, max_examples=QUICK_EXAMPLES)
