"""The edit, on ``vllm/entrypoints/openai/chat_completion/protocol.py``.

A harmony (gpt-oss) server puts ``<|call|>`` and ``<|return|>`` in its default sampling params'
``stop_token_ids``, but vLLM 0.24's ``ChatCompletionRequest.to_sampling_params`` passes only the
request's own ``stop_token_ids`` (default ``[]``): generation runs past a tool call
(vllm-project/vllm#22519). prime-rl wraps the method and merges the defaults into the result with a
set (the order of the ids is lost); here the method gets the merge vLLM 0.25 shipped, before its
``return SamplingParams.from_optional(...)``, and that call's ``stop_token_ids=`` takes the merged
list::

    stop_token_ids = self.stop_token_ids  # toolkit:harmony-stop-token-merge
    default_stop_ids = default_sampling_params.get("stop_token_ids")  # toolkit:harmony-stop-token-merge
    if default_stop_ids:  # toolkit:harmony-stop-token-merge
        if not stop_token_ids:
            stop_token_ids = list(default_stop_ids)
        else:
            stop_token_ids = list(dict.fromkeys([*stop_token_ids, *default_stop_ids]))
    return SamplingParams.from_optional(..., stop_token_ids=stop_token_ids, ...)

Anchor: the method's ``return SamplingParams.from_optional(...)`` with
``stop_token_ids=self.stop_token_ids``, exactly one (vLLM 0.25 passes the merged local: not found,
and ``not_needed`` says why).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer, in_method

REQUEST = "ChatCompletionRequest"
METHOD = "to_sampling_params"

REQUESTS_OWN = m.Arg(keyword=m.Name("stop_token_ids"),
                     value=m.Attribute(value=m.Name("self"), attr=m.Name("stop_token_ids")))
RETURNS_PARAMS = m.SimpleStatementLine(body=[m.Return(value=m.Call(
    func=m.Attribute(value=m.Name("SamplingParams"), attr=m.Name("from_optional")),
    args=[m.ZeroOrMore(), REQUESTS_OWN, m.ZeroOrMore()]))])

MERGE = (
    "stop_token_ids = self.stop_token_ids",
    'default_stop_ids = default_sampling_params.get("stop_token_ids")',
    '''\
if default_stop_ids:
    if not stop_token_ids:
        stop_token_ids = list(default_stop_ids)
    else:
        stop_token_ids = list(dict.fromkeys([*stop_token_ids, *default_stop_ids]))
''',
)


class ChatCompletionRequestTransformer(AnchoredTransformer):
    INSIDE = {REQUEST: frozenset({METHOD})}
    ANCHORS = {"return": f"`return SamplingParams.from_optional(..., stop_token_ids=self.stop_token_ids, ...)` "
                         f"of {REQUEST}.{METHOD}"}

    @m.leave(m.FunctionDef(name=m.Name(METHOD)))
    @in_method(REQUEST, METHOD)
    def merge_the_defaults(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        body = list(updated_node.body.body)
        found = [i for i, statement in enumerate(body) if m.matches(statement, RETURNS_PARAMS)]
        if len(found) != 1:
            return updated_node
        self.hit("return")
        (at,) = found
        returned = body[at]
        assert isinstance(returned, cst.SimpleStatementLine)
        (ret,) = returned.body
        assert isinstance(ret, cst.Return) and isinstance(ret.value, cst.Call)
        args = [arg.with_changes(value=cst.Name("stop_token_ids")) if m.matches(arg, REQUESTS_OWN) else arg
                for arg in ret.value.args]
        merged = self.marked_line(returned.with_changes(
            body=[ret.with_changes(value=ret.value.with_changes(args=args))], leading_lines=[]))
        merge = [self.marked_statement(code) for code in MERGE]
        merge[0] = merge[0].with_changes(leading_lines=returned.leading_lines)
        body[at:at + 1] = [*merge, merged]
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))
