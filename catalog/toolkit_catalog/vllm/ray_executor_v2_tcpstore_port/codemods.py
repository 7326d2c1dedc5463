"""The edit, on ``vllm/v1/executor/ray_executor_v2.py``.

``RayExecutorV2._init_executor`` picks the torch.distributed TCPStore port with
``_select_tcpstore_port`` (a bind probe) but binds it only later, in the rank-0 worker. In between,
the broadcast ``MessageQueue`` of an engine that spans nodes takes a TCP port with
``get_open_port()`` and holds it; both searches start at ``VLLM_PORT``, so the queue takes the port
the probe just released and startup dies with ``EADDRINUSE``. A non-DP engine arrives with
``local_dp_rank=0`` (``ParallelConfig`` sets it), so vLLM's own per-rank window starts at port 100
and falls back to ``get_open_port()``: the same port again. NeMo-RL's fix, placed before the
``local_dp_rank is None`` test as theirs is::

    if envs.VLLM_PORT is not None:  # toolkit:ray-executor-v2-tcpstore-port
        try:
            return _get_open_port(start_port=envs.VLLM_PORT + 32, max_attempts=32)
        except RuntimeError:
            pass
    if local_dp_rank is None:
        return get_open_port()

Anchors: that ``if`` (exactly one in the method), and the module's ``import vllm.envs as envs`` and
``_get_open_port`` import, which the inserted code uses (NeMo-RL's string replacement assumes them;
here a release without them stops the apply). vLLM 0.29 removed the probe (``not_needed``): there
the method is gone and the anchor is not found.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer, in_method

EXECUTOR = "RayExecutorV2"
METHOD = "_select_tcpstore_port"

NON_DP = m.If(test=m.Comparison(left=m.Name("local_dp_rank"),
                                comparisons=[m.ComparisonTarget(operator=m.Is(), comparator=m.Name("None"))]))
IMPORTS_ENVS = m.Import(names=[m.ImportAlias(name=m.Attribute(value=m.Name("vllm"), attr=m.Name("envs")),
                                             asname=m.AsName(name=m.Name("envs")))])
IMPORTS_GET_OPEN_PORT = m.ImportFrom(module=m.Attribute(attr=m.Name("network_utils")),
                                     names=[m.ZeroOrMore(), m.ImportAlias(name=m.Name("_get_open_port")),
                                            m.ZeroOrMore()])

SEARCH_PAST_THE_QUEUE = '''\
if envs.VLLM_PORT is not None:
    # NeMo-RL: the broadcast MessageQueue binds and holds a port searched from VLLM_PORT before
    # this one is bound in the rank-0 worker; search a window past the queue's, inside the band.
    try:
        return _get_open_port(start_port=envs.VLLM_PORT + 32, max_attempts=32)
    except RuntimeError:
        pass
'''


class RayExecutorV2Transformer(AnchoredTransformer):
    INSIDE = {EXECUTOR: frozenset({METHOD})}
    ANCHORS = {
        "import-envs": "a module-level `import vllm.envs as envs`",
        "import-_get_open_port": "`_get_open_port` imported from vllm.utils.network_utils",
        "non-dp-branch": f"the one `if local_dp_rank is None:` of {EXECUTOR}.{METHOD}",
    }

    @m.visit(IMPORTS_ENVS)
    def imports_envs(self, node: cst.Import) -> None:
        self.hit("import-envs")

    @m.visit(IMPORTS_GET_OPEN_PORT)
    def imports_get_open_port(self, node: cst.ImportFrom) -> None:
        self.hit("import-_get_open_port")

    @m.leave(m.FunctionDef(name=m.Name(METHOD)))
    @in_method(EXECUTOR, METHOD)
    def search_past_the_queue(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        body = list(updated_node.body.body)
        found = [i for i, statement in enumerate(body) if m.matches(statement, NON_DP)]
        if len(found) != 1:
            return updated_node  # none or two: the anchor report names it and nothing is written
        self.hit("non-dp-branch")
        (at,) = found
        block = self.marked_statement(SEARCH_PAST_THE_QUEUE).with_changes(leading_lines=body[at].leading_lines)
        body[at:at + 1] = [block, body[at].with_changes(leading_lines=[])]
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))
