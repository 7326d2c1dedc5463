"""The edit, on ``vllm/v1/engine/coordinator.py``.

``DPCoordinator._wait_for_zmq_addrs`` waits a hard-coded 120 s for the coordinator child process
to report its ZMQ addresses. The child is spawned on the DP-rank-0 API server while every engine
core of the node imports and loads weights, so its own spawn-time import can take longer (prime-rl
saw it on multi-node disaggregated launches) and startup fails. prime-rl replaces the method with a
copy reading ``PRIME_DP_COORDINATOR_STARTUP_TIMEOUT`` (default 300); here only the assignment
changes, to the same default under this catalog's name::

    import os  # toolkit:dp-coordinator-startup-timeout
    timeout = float(os.environ.get("TOOLKIT_DP_COORDINATOR_STARTUP_TIMEOUT", "300"))  # toolkit:dp-coordinator-startup-timeout

The error message that names the timeout, and the rest of the method, stay the release's own.
Anchor: the one ``timeout = <number>`` of the method.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer, in_method

COORDINATOR = "DPCoordinator"
METHOD = "_wait_for_zmq_addrs"
VARIABLE = "TOOLKIT_DP_COORDINATOR_STARTUP_TIMEOUT"

HARD_CODED = m.SimpleStatementLine(body=[m.Assign(targets=[m.AssignTarget(target=m.Name("timeout"))],
                                                  value=m.Integer() | m.Float())])
CONFIGURABLE = ("import os", f'timeout = float(os.environ.get("{VARIABLE}", "300"))')


class DPCoordinatorTransformer(AnchoredTransformer):
    INSIDE = {COORDINATOR: frozenset({METHOD})}
    ANCHORS = {"timeout": f"the one `timeout = <number>` of {COORDINATOR}.{METHOD}"}

    @m.leave(m.IndentedBlock())
    @in_method(COORDINATOR, METHOD)
    def read_the_timeout(self, original_node: cst.IndentedBlock, updated_node: cst.IndentedBlock
                         ) -> cst.IndentedBlock:
        body = list(updated_node.body)
        found = [i for i, statement in enumerate(body) if m.matches(statement, HARD_CODED)]
        if len(found) != 1:
            return updated_node
        self.hit("timeout")  # a second block with one is a second hit: the apply stops on the anchor
        (at,) = found
        added = [self.marked_statement(code) for code in CONFIGURABLE]
        added[0] = added[0].with_changes(leading_lines=body[at].leading_lines)
        body[at:at + 1] = added
        return updated_node.with_changes(body=body)
