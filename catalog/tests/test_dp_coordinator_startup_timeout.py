"""dp-coordinator-startup-timeout (prime-rl) on a snippet in vLLM 0.24-0.33's shape (the real files are
test_conformance.py's), and its behaviour: the patched statements give the variable's value, or 300
when it is unset. Runs without vLLM."""

from __future__ import annotations

import pytest

from toolkit.testing import assert_codemod
from toolkit_catalog.vllm.dp_coordinator_startup_timeout.codemods import CONFIGURABLE, DPCoordinatorTransformer
from toolkit_catalog.vllm.dp_coordinator_startup_timeout.patch import PATCH

RELPATH = "v1/engine/coordinator.py"

BEFORE = '''
class DPCoordinator:
    def _wait_for_zmq_addrs(self, zmq_addr_pipe) -> tuple[str, str, str]:
        try:
            timeout = 120
            ready = multiprocessing.connection.wait(
                [zmq_addr_pipe, self.proc.sentinel], timeout=timeout
            )
        finally:
            zmq_addr_pipe.close()

    def shutdown(self, timeout: float | None = None) -> None:
        timeout = 5
'''

AFTER = '''
class DPCoordinator:
    def _wait_for_zmq_addrs(self, zmq_addr_pipe) -> tuple[str, str, str]:
        try:
            import os  # toolkit:dp-coordinator-startup-timeout
            timeout = float(os.environ.get("TOOLKIT_DP_COORDINATOR_STARTUP_TIMEOUT", "300"))  # toolkit:dp-coordinator-startup-timeout
            ready = multiprocessing.connection.wait(
                [zmq_addr_pipe, self.proc.sentinel], timeout=timeout
            )
        finally:
            zmq_addr_pipe.close()

    def shutdown(self, timeout: float | None = None) -> None:
        timeout = 5
'''


def test_the_timeout_is_read_from_the_environment_and_shutdown_is_untouched():
    assert_codemod(DPCoordinatorTransformer, BEFORE, AFTER, engine_version="0.33.0", relpath=RELPATH,
                   patch_id=PATCH.id)


def test_a_method_whose_timeout_is_no_literal_fails_on_its_anchor():
    before = BEFORE.replace("            timeout = 120\n", "            timeout = envs.VLLM_TIMEOUT\n")
    with pytest.raises(AssertionError, match="timeout"):
        assert_codemod(DPCoordinatorTransformer, before, before, relpath=RELPATH, patch_id=PATCH.id)


@pytest.mark.parametrize(("value", "seconds"), [(None, 300.0), ("900", 900.0), ("2.5", 2.5)])
def test_the_wait_is_the_variables_value_or_300(monkeypatch, value, seconds):
    if value is None:
        monkeypatch.delenv("TOOLKIT_DP_COORDINATOR_STARTUP_TIMEOUT", raising=False)
    else:
        monkeypatch.setenv("TOOLKIT_DP_COORDINATOR_STARTUP_TIMEOUT", value)
    namespace: dict = {}
    exec("\n".join(CONFIGURABLE), namespace)
    assert namespace["timeout"] == seconds
