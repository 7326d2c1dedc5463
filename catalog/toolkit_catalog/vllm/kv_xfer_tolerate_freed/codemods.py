"""The edit, on ``vllm/v1/core/sched/scheduler.py``.

``Scheduler._update_from_kv_xfer_finished`` walks the KV connector's ``finished_recving`` and then its
``finished_sending`` request ids, and in each loop ``assert req_id in self.requests``. A request
aborted while its KV transfers were in flight can have both notices land in one step: the recving
loop frees it, the sending loop's assert fails, and the EngineCore dies (on a data-parallel
deployment, every rank with it). In each loop the assert becomes::

    if req_id not in self.requests:  # toolkit:kv-xfer-tolerate-freed
        continue

Nothing else of the method is touched, so what a release adds to it stays (vLLM 0.32 added
``self._set_kv_fetch_stage(req, KV_FETCH_COMPLETED_WAITING)`` to the recving loop, which prime-rl's
copied method does not have). A loop without that assert (a release that changed it) is an anchor not
found: the apply stops and writes nothing.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer, in_method

SCHEDULER = "Scheduler"
METHOD = "_update_from_kv_xfer_finished"

# `assert req_id in self.requests`, the statement each loop replaces
PRESENT = m.SimpleStatementLine(body=[m.Assert(test=m.Comparison(
    left=m.Name("req_id"),
    comparisons=[m.ComparisonTarget(operator=m.In(), comparator=m.Attribute(value=m.Name("self"),
                                                                             attr=m.Name("requests")))]))])


def iterates(notices: str) -> m.BaseMatcherNode:
    """``for ... in <x>.<notices> or ()`` (or without the ``or ()``)."""
    listed = m.Attribute(attr=m.Name(notices))
    return m.For(iter=m.BooleanOperation(left=listed, operator=m.Or()) | listed)


class SchedulerTransformer(AnchoredTransformer):
    INSIDE = {SCHEDULER: frozenset({METHOD})}
    ANCHORS = {
        "finished_recving": f"`assert req_id in self.requests` in the finished_recving loop of {SCHEDULER}.{METHOD}",
        "finished_sending": f"`assert req_id in self.requests` in the finished_sending loop of {SCHEDULER}.{METHOD}",
    }

    @m.leave(iterates("finished_recving") | iterates("finished_sending"))
    @in_method(SCHEDULER, METHOD)
    def skip_freed(self, original_node: cst.For, updated_node: cst.For) -> cst.For:
        notices = "finished_recving" if m.matches(original_node, iterates("finished_recving")) else "finished_sending"
        body = list(updated_node.body.body)
        found = [i for i, statement in enumerate(body) if m.matches(statement, PRESENT)]
        if len(found) != 1:
            return updated_node  # not hit: the anchor report names the loop, and nothing is written
        self.hit(notices)
        (at,) = found
        skip = self.marked_statement("if req_id not in self.requests:\n    continue\n")
        body[at] = skip.with_changes(leading_lines=body[at].leading_lines)  # a comment above the assert stays
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))
