"""The edit, on ``sglang/srt/disaggregation/decode.py``.

``SchedulerDisaggregationDecodeMixin.process_decode_queue`` (the decode side of prefill/decode
disaggregation) first tries to resume retracted requests; while some remain it returns at once::

    if len(self.disagg_decode_prealloc_queue.retracted_queue) > 0:
        # if there are still retracted requests, we do not allocate new requests
        return

That also leaves the requests whose KV transfer has completed in the transfer queue. Their KV is
already committed, and only moving them to the waiting queue frees the reserved decode-token budget
that the retracted requests need to resume: the decode server waits forever. The edit drains them
before that ``return``, as slime's SGLang patch does::

        drained_reqs = self.disagg_decode_transfer_queue.pop_transferred()  # toolkit:decode-drain-transferred
        self.waiting_queue.extend(drained_reqs)  # toolkit:decode-drain-transferred
        return

New requests are still not pre-allocated there. Only that block changes: the rest of the method,
which differs between releases (0.5.23 resolves deferred releases first and reads its settings from
``get_disagg()``), stays the release's own.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer, in_method

MIXIN = "SchedulerDisaggregationDecodeMixin"
METHOD = "process_decode_queue"

# `len(self.disagg_decode_prealloc_queue.retracted_queue) > 0`
RETRACTED_LEFT = m.Comparison(
    left=m.Call(func=m.Name("len"), args=[m.Arg(value=m.Attribute(
        value=m.Attribute(value=m.Name("self"), attr=m.Name("disagg_decode_prealloc_queue")),
        attr=m.Name("retracted_queue")))]),
    comparisons=[m.ComparisonTarget(operator=m.GreaterThan(), comparator=m.Integer("0"))])
BARE_RETURN = m.SimpleStatementLine(body=[m.Return(value=None)])

DRAIN = (
    "drained_reqs = self.disagg_decode_transfer_queue.pop_transferred()",
    "self.waiting_queue.extend(drained_reqs)",
)


class DecodeSchedulerTransformer(AnchoredTransformer):
    INSIDE = {MIXIN: frozenset({METHOD})}
    ANCHORS = {
        "retracted-return": f"the `if len(self.disagg_decode_prealloc_queue.retracted_queue) > 0:` block of "
                            f"{MIXIN}.{METHOD} that ends in a bare `return`",
    }

    @m.leave(m.If(test=RETRACTED_LEFT, orelse=None))
    @in_method(MIXIN, METHOD)
    def drain_before_return(self, original_node: cst.If, updated_node: cst.If) -> cst.If:
        body = list(updated_node.body.body)
        if not body or not m.matches(body[-1], BARE_RETURN):
            return updated_node  # another shape of the block: not hit, the apply stops on the anchor
        self.hit("retracted-return")
        drain = [self.marked_statement(line) for line in DRAIN]
        # a comment above the `return` stays above the block it explains (now starting with the drain)
        drain[0] = drain[0].with_changes(leading_lines=body[-1].leading_lines)
        returns = body[-1].with_changes(leading_lines=[])
        return updated_node.with_changes(body=updated_node.body.with_changes(body=[*body[:-1], *drain, returns]))
