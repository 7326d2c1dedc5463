"""ray-executor-v2-tcpstore-port (NeMo-RL) on a snippet in vLLM 0.25-0.28's shape (the real files are
test_conformance.py's). Runs without vLLM: toolkit.testing.assert_codemod transforms the snippet.

No behaviour test here: the collision needs an engine whose Ray workers span two nodes (the queue
takes a TCP socket only then), which a CPU CI runner cannot start."""

from __future__ import annotations

import pytest

from toolkit.testing import assert_codemod
from toolkit_catalog.vllm.ray_executor_v2_tcpstore_port.codemods import RayExecutorV2Transformer
from toolkit_catalog.vllm.ray_executor_v2_tcpstore_port.patch import PATCH

RELPATH = "v1/executor/ray_executor_v2.py"

BEFORE = '''
import vllm.envs as envs
from vllm.utils.network_utils import (
    _get_open_port,
    get_distributed_init_method,
    get_open_port,
)


class RayExecutorV2(MultiprocExecutor):
    @staticmethod
    def _select_tcpstore_port(local_dp_rank: int | None, master_port: int) -> int:
        """Pick the torch.distributed TCPStore port for this engine."""
        if local_dp_rank is None:
            return get_open_port()
        # Offset past the DP master port reserved range, one window per rank.
        window = 32
        start_port = master_port + 100 + local_dp_rank * window
        try:
            return _get_open_port(start_port=start_port, max_attempts=window)
        except RuntimeError:
            return get_open_port()

    def _init_executor(self) -> None:
        if local_dp_rank is None:
            pass
'''

AFTER = '''
import vllm.envs as envs
from vllm.utils.network_utils import (
    _get_open_port,
    get_distributed_init_method,
    get_open_port,
)


class RayExecutorV2(MultiprocExecutor):
    @staticmethod
    def _select_tcpstore_port(local_dp_rank: int | None, master_port: int) -> int:
        """Pick the torch.distributed TCPStore port for this engine."""
        if envs.VLLM_PORT is not None:  # toolkit:ray-executor-v2-tcpstore-port
            # NeMo-RL: the broadcast MessageQueue binds and holds a port searched from VLLM_PORT before
            # this one is bound in the rank-0 worker; search a window past the queue's, inside the band.
            try:
                return _get_open_port(start_port=envs.VLLM_PORT + 32, max_attempts=32)
            except RuntimeError:
                pass
        if local_dp_rank is None:
            return get_open_port()
        # Offset past the DP master port reserved range, one window per rank.
        window = 32
        start_port = master_port + 100 + local_dp_rank * window
        try:
            return _get_open_port(start_port=start_port, max_attempts=window)
        except RuntimeError:
            return get_open_port()

    def _init_executor(self) -> None:
        if local_dp_rank is None:
            pass
'''


def transform(before: str, after: str) -> None:
    assert_codemod(RayExecutorV2Transformer, before, after, engine_version="0.28.0", relpath=RELPATH,
                   patch_id=PATCH.id)


def test_the_search_past_the_queue_goes_before_the_non_dp_branch_and_nothing_else_moves():
    transform(BEFORE, AFTER)  # the other method's `if local_dp_rank is None` is not ours


@pytest.mark.parametrize(("dropped", "anchor"), [
    ("import vllm.envs as envs\n", "import-envs"),
    ("    _get_open_port,\n", "import-_get_open_port"),
])
def test_a_module_without_what_the_inserted_code_uses_fails_on_its_anchor(dropped, anchor):
    # NeMo-RL's string replacement would write code that raises NameError at engine start here
    before = BEFORE.replace(dropped, "", 1)
    with pytest.raises(AssertionError, match=anchor):
        transform(before, before)


def test_vllm_0_29s_shape_without_the_probe_fails_on_its_anchor_and_is_not_needed():
    fixed = BEFORE.replace("_select_tcpstore_port", "create_dist_init_method")
    with pytest.raises(AssertionError, match="non-dp-branch"):
        transform(fixed, fixed)
    assert PATCH.not_needed_on("0.29.0") and not PATCH.not_needed_on("0.28.0")
