"""The edit, on ``vllm/model_executor/models/llama_eagle3.py``.

The speculative-decoding proposer shares the target model's lm_head with an EAGLE drafter unless the
drafter says it has its own (``has_own_lm_head``) or the two weights are equal. vLLM's Llama EAGLE-3
drafter builds its lm_head over ``draft_vocab_size`` but never sets ``has_own_lm_head``; a drafter
trained with a truncated vocabulary then has its head judged by the weight comparison alone. NeMo-RL
sets it after the head is built, as::

    self.lm_head = ParallelLMHead(self.config.draft_vocab_size, ...)
    self.has_own_lm_head = (  # toolkit:eagle3-own-lm-head
        self.config.draft_vocab_size != self.config.vocab_size
    )

The anchor is the one ``self.lm_head = ParallelLMHead(self.config.draft_vocab_size, ...)`` of
``Eagle3LlamaForCausalLM.__init__``; NeMo-RL's snippet needs the five lines of that call and the next
line verbatim, so a reformatted argument list is a silent no-op there and still an edit here.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer, in_method

DRAFTER = "Eagle3LlamaForCausalLM"
METHOD = "__init__"

DRAFT_VOCAB = m.Attribute(value=m.Attribute(value=m.Name("self"), attr=m.Name("config")),
                          attr=m.Name("draft_vocab_size"))
BUILDS_HEAD = m.SimpleStatementLine(body=[m.Assign(
    targets=[m.AssignTarget(target=m.Attribute(value=m.Name("self"), attr=m.Name("lm_head")))],
    value=m.Call(func=m.Name("ParallelLMHead"), args=[m.Arg(value=DRAFT_VOCAB, keyword=None), m.ZeroOrMore()]))])

OWNS_HEAD = '''\
self.has_own_lm_head = (
    self.config.draft_vocab_size != self.config.vocab_size
)
'''


class Eagle3Transformer(AnchoredTransformer):
    INSIDE = {DRAFTER: frozenset({METHOD})}
    ANCHORS = {"lm-head": f"the one `self.lm_head = ParallelLMHead(self.config.draft_vocab_size, ...)` "
                          f"of {DRAFTER}.{METHOD}"}

    @m.leave(m.FunctionDef(name=m.Name(METHOD)))
    @in_method(DRAFTER, METHOD)
    def own_the_head(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        body = list(updated_node.body.body)
        found = [i for i, statement in enumerate(body) if m.matches(statement, BUILDS_HEAD)]
        if len(found) != 1:
            return updated_node
        self.hit("lm-head")
        (at,) = found
        body.insert(at + 1, self.marked_statement(OWNS_HEAD))
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))
