"""The one edit, on ``vllm/entrypoints/openai/chat_completion/protocol.py``.

``ChatCompletionRequest.build_tok_params`` builds the ``TokenizeParams`` that check the rendered
prompt; its ``max_output_tokens=`` argument is how much of ``max_model_len`` that check keeps free
for the output. The edit passes the value through the runtime, which keeps one token free instead of
all of ``max_tokens``::

    max_output_tokens=_clamp_max_tokens.output_tokens_to_reserve(max_output_tokens or 0, self.truncate_prompt_tokens),  # toolkit:clamp-max-tokens

vLLM 0.30-0.32 write ``max_output_tokens or 0`` there and 0.33 ``max_output_tokens``: the edit keeps
whatever expression the release has, so one matcher serves every release.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer, in_method

REQUEST = "ChatCompletionRequest"
METHOD = "build_tok_params"
ALIAS = "_clamp_max_tokens"


class ProtocolTransformer(AnchoredTransformer):
    # Another distribution's runtime: the codemod writes `from clamp_max_tokens import runtime as
    # _clamp_max_tokens` after the file's first import (guarded by the patch engine).
    RUNTIME, RUNTIME_ALIAS = "clamp_max_tokens", ALIAS
    INSIDE = {REQUEST: frozenset({METHOD})}
    ANCHORS = {
        "max_output_tokens": f"the max_output_tokens= argument of TokenizeParams(...) in {REQUEST}.{METHOD}",
    }

    @m.leave(m.Arg(keyword=m.Name("max_output_tokens")))
    @m.call_if_inside(m.Call(func=m.Name("TokenizeParams")))
    @in_method(REQUEST, METHOD)
    def reserve_less(self, original_node: cst.Arg, updated_node: cst.Arg) -> cst.Arg:
        self.hit("max_output_tokens")
        call = cst.parse_expression(f"{ALIAS}.output_tokens_to_reserve(_, self.truncate_prompt_tokens)")
        value = call.with_changes(args=[cst.Arg(updated_node.value, comma=call.args[0].comma), call.args[1]])
        return self.marked_arg(updated_node.with_changes(value=value))

    def marked_arg(self, arg: cst.Arg) -> cst.Arg:
        """``arg`` with the marker after its comma, on its own line of the call; where the argument
        does not end its line, the marker goes at the end of the statement instead."""
        comma = arg.comma
        if isinstance(comma, cst.Comma) and isinstance(comma.whitespace_after, cst.ParenthesizedWhitespace):
            after = comma.whitespace_after
            first_line = after.first_line.with_changes(
                whitespace=cst.SimpleWhitespace("  "), comment=self.marker_comment(after.first_line.comment))
            return arg.with_changes(comma=comma.with_changes(whitespace_after=after.with_changes(first_line=first_line)))
        self.mark_this_statement()
        return arg
