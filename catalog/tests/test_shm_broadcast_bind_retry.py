"""shm-broadcast-bind-retry (NeMo-RL) on a snippet in vLLM 0.24-0.27's shape (the block is the same in
both versions of the file; the real files are test_conformance.py's). Runs without vLLM.

No behaviour test here: the race needs the workers of a non-driver node building their queues at the
same instant (an engine spanning two nodes), which a CPU CI runner cannot start."""

from __future__ import annotations

import pytest

from toolkit.testing import assert_codemod
from toolkit_catalog.vllm.shm_broadcast_bind_retry.codemods import MessageQueueTransformer
from toolkit_catalog.vllm.shm_broadcast_bind_retry.patch import PATCH

RELPATH = "distributed/device_communicators/shm_broadcast.py"

HEAD = '''
import zmq

import vllm.envs as envs
from vllm.utils.network_utils import (
    get_ip,
    get_open_port,
    is_valid_ipv6_address,
)

logger = init_logger(__name__)

'''

BEFORE = HEAD + '''
class MessageQueue:
    def __init__(self, n_reader, n_local_reader, connect_ip=None):
        if n_remote_reader > 0:
            self.remote_socket = context.socket(XPUB)
            remote_subscribe_port = get_open_port()
            if is_valid_ipv6_address(connect_ip):
                connect_ip = f"[{connect_ip}]"
            socket_addr = f"tcp://{connect_ip}:{remote_subscribe_port}"
            self.remote_socket.bind(socket_addr)
            remote_subscribe_addr = f"tcp://{connect_ip}:{remote_subscribe_port}"
        else:
            remote_subscribe_addr = None
'''

AFTER = HEAD + '''
class MessageQueue:
    def __init__(self, n_reader, n_local_reader, connect_ip=None):
        if n_remote_reader > 0:
            self.remote_socket = context.socket(XPUB)
            remote_subscribe_port = get_open_port()
            if is_valid_ipv6_address(connect_ip):
                connect_ip = f"[{connect_ip}]"
            _nrl_bind_attempts = 64  # toolkit:shm-broadcast-bind-retry
            for _nrl_bind_attempt in range(_nrl_bind_attempts):
                socket_addr = f"tcp://{connect_ip}:{remote_subscribe_port}"
                try:
                    self.remote_socket.bind(socket_addr)
                    break
                except zmq.ZMQError:
                    if _nrl_bind_attempt == _nrl_bind_attempts - 1:
                        raise
                    from vllm.utils.network_utils import _get_open_port

                    logger.info(
                        "Port %s was taken between probe and bind; retrying.",
                        remote_subscribe_port,
                    )
                    remote_subscribe_port = (
                        _get_open_port(start_port=remote_subscribe_port + 1)
                        if envs.VLLM_PORT is not None
                        else get_open_port()
                    )
            remote_subscribe_addr = f"tcp://{connect_ip}:{remote_subscribe_port}"
        else:
            remote_subscribe_addr = None
'''


def transform(before: str, after: str) -> None:
    assert_codemod(MessageQueueTransformer, before, after, engine_version="0.27.1", relpath=RELPATH,
                   patch_id=PATCH.id)


def test_the_bind_is_retried_and_the_published_address_follows_the_port_bound():
    transform(BEFORE, AFTER)


@pytest.mark.parametrize(("dropped", "anchor"), [
    ("import zmq\n", "import-zmq"),
    ("import vllm.envs as envs\n", "import-envs"),
    ("    get_open_port,\n", "import-get_open_port"),
    ("logger = init_logger(__name__)\n", "logger"),
])
def test_a_module_without_what_the_retry_uses_fails_on_its_anchor(dropped, anchor):
    before = BEFORE.replace(dropped, "", 1)
    with pytest.raises(AssertionError, match=anchor):
        transform(before, before)


def test_vllm_0_28s_bind_to_port_0_fails_on_its_anchor_and_is_not_needed():
    fixed = BEFORE.replace('            socket_addr = f"tcp://{connect_ip}:{remote_subscribe_port}"\n'
                           "            self.remote_socket.bind(socket_addr)\n",
                           '            self.remote_socket.bind(f"tcp://{connect_ip}:0")\n')
    with pytest.raises(AssertionError, match="bind"):
        transform(fixed, fixed)
    assert PATCH.not_needed_on("0.28.0") and not PATCH.not_needed_on("0.27.1")

