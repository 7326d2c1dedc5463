"""Patch ``responses-stream``: correct Responses-API streaming events on vLLM's simple path.

On the non-harmony path vLLM 0.32/0.33 leak tool-call markup as text, drop text after a tool call,
emit whitespace-only items, and build the non-streaming output with a different parser than the
stream. This patch swaps in our own state machine (:mod:`.machine`, driven from :mod:`.runtime`) so
that reasoning, text and tool calls come out as well-formed items in any order, the terminal event is
``response.completed`` / ``response.incomplete`` / ``response.failed``, and the non-streaming
response holds the same items as the stream. :mod:`.grammar` checks a stream against the event
grammar (engine-independent; ``toolkit verify`` uses it). See docs/responses-streaming.md.
"""

# The declaration lives in .patch so that importing .runtime inside the engine loads neither
# libcst nor the patch engine.
