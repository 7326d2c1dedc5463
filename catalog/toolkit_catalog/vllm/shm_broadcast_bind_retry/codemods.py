"""The edit, on ``vllm/distributed/device_communicators/shm_broadcast.py``.

``MessageQueue.__init__`` picks its remote (TCP) socket's port with ``get_open_port()``, which
probes a port and releases it, and binds it with ZMQ a few statements later. Every worker on a
non-driver node builds its queue at the same instant from the same ``VLLM_PORT``: all probe the same
free port and all but one die with ``zmq.error.ZMQError: Address already in use``. NeMo-RL's fix
retries the bind, advancing past the port that was lost (a port a peer holds is visible to the next
probe, so the search ends)::

    _nrl_bind_attempts = 64  # toolkit:shm-broadcast-bind-retry
    for _nrl_bind_attempt in range(_nrl_bind_attempts):
        socket_addr = f"tcp://{connect_ip}:{remote_subscribe_port}"
        try:
            self.remote_socket.bind(socket_addr)
            break
        except zmq.ZMQError:
            ...  (re-raise on the last attempt, else the next port from VLLM_PORT's band)

The two statements it replaces (``socket_addr = f"tcp://..."`` and ``self.remote_socket.bind(
socket_addr)``) must follow each other exactly once in the method (an anchor); the module must import
``zmq``, ``vllm.envs as envs`` and ``get_open_port``, and define ``logger``, which the retry uses
(anchors: NeMo-RL's replacement assumes them). Everything around it (the IPv6 branch, the address
published to readers, which then carries the port actually bound) is the release's own.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer, in_method

QUEUE = "MessageQueue"
METHOD = "__init__"

SOCKET_ADDR = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name("socket_addr"))],
                                                   value=m.FormattedString())])
BIND = m.SimpleStatementLine(body=[m.Expr(value=m.Call(
    func=m.Attribute(value=m.Attribute(value=m.Name("self"), attr=m.Name("remote_socket")), attr=m.Name("bind")),
    args=[m.Arg(value=m.Name("socket_addr"))]))])

RETRY = '''\
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
'''


class MessageQueueTransformer(AnchoredTransformer):
    INSIDE = {QUEUE: frozenset({METHOD})}
    ANCHORS = {
        "import-zmq": "a module-level `import zmq`",
        "import-envs": "a module-level `import vllm.envs as envs`",
        "import-get_open_port": "`get_open_port` imported from vllm.utils.network_utils",
        "logger": "a module-level `logger = ...`",
        "bind": f"`socket_addr = f\"tcp://...\"` followed by `self.remote_socket.bind(socket_addr)` in {QUEUE}.{METHOD}",
    }

    @m.visit(m.Import(names=[m.ImportAlias(name=m.Name("zmq"), asname=None)]))
    def imports_zmq(self, node: cst.Import) -> None:
        self.hit("import-zmq")

    @m.visit(m.Import(names=[m.ImportAlias(name=m.Attribute(value=m.Name("vllm"), attr=m.Name("envs")),
                                           asname=m.AsName(name=m.Name("envs")))]))
    def imports_envs(self, node: cst.Import) -> None:
        self.hit("import-envs")

    @m.visit(m.ImportFrom(module=m.Attribute(attr=m.Name("network_utils")),
                          names=[m.ZeroOrMore(), m.ImportAlias(name=m.Name("get_open_port")), m.ZeroOrMore()]))
    def imports_get_open_port(self, node: cst.ImportFrom) -> None:
        self.hit("import-get_open_port")

    def visit_Module(self, node: cst.Module) -> None:
        if any(m.matches(s, m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name("logger"))])]))
               for s in node.body):
            self.hit("logger")

    @m.leave(m.IndentedBlock())
    @in_method(QUEUE, METHOD)
    def retry_the_bind(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock) -> cst.IndentedBlock:
        body = list(updated_node.body)
        pairs = [i for i in range(len(body) - 1) if m.matches(body[i], SOCKET_ADDR) and m.matches(body[i + 1], BIND)]
        if len(pairs) != 1:
            return updated_node
        self.hit("bind")  # a second block with the pair is a second hit: the apply stops on the anchor
        (at,) = pairs
        attempts = self.marked_statement("_nrl_bind_attempts = 64").with_changes(leading_lines=body[at].leading_lines)
        retry = cst.parse_statement(RETRY)
        body[at:at + 2] = [attempts, retry]
        return updated_node.with_changes(body=body)
