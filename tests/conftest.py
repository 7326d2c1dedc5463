"""Shared fixtures (engine venvs, engine sources, the tiny model, the SGLang CPU shim) live in
tests/harness/fixtures.py; every test folder sees them through this plugin line. tests/harness/phases.py
times each folder; tests/harness/workers.py gives each parallel (xdist) worker its own engine venvs."""

pytest_plugins = ["tests.harness.fixtures", "tests.harness.phases", "tests.harness.workers"]

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
