"""tito: token in, token out on SGLang's chat completions.

``input_ids`` on a chat request is the prompt, exactly (no chat template, no tokenization), with every
sampling option, tool and reasoning parsing and streaming working as they do with ``messages``;
``token_id`` on every logprob entry; ``logprob_start_len`` for prompt logprobs from a position on
(``prompt_logprobs`` on the response). The ids come back as ``prompt_token_ids`` / ``token_ids``
through the ``token-ids`` patch, which tito composes with. Bad input is a 400 naming the field.
The contract, with examples: docs/tito.md.
"""

# The declaration lives in .patch so that importing .runtime inside the engine loads neither
# libcst nor the patch engine.
