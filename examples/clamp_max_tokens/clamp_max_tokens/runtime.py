"""What the patched vLLM calls, in the API server process. The standard library only: no libcst, no
serving-toolkit (the patched vLLM imports this module, not the patch engine)."""

from __future__ import annotations


def output_tokens_to_reserve(requested: int | None, truncate_prompt_tokens: int | None) -> int | None:
    """How many tokens of ``max_model_len`` vLLM's prompt check keeps free for the output.

    vLLM up to 0.32 keeps all of ``max_tokens`` free, so a prompt that fits but leaves less than
    ``max_tokens`` is refused with a 400. Keeping one token free instead lets every prompt with room
    for at least one output token through; vLLM's ``get_max_tokens`` then clamps the sampling budget
    to ``max_model_len - prompt``. A request that asks for truncation (``truncate_prompt_tokens``)
    keeps the full reservation: there it decides how far the prompt is cut, not whether it fits.
    """
    if requested is None or truncate_prompt_tokens is not None:
        return requested
    return min(requested, 1)
