"""The edit on small before/after snippets, in the shapes vLLM's releases have (the real files are
the conformance test's). Runs without vLLM: toolkit.testing.assert_codemod transforms the snippet."""

from __future__ import annotations

import pytest

from clamp_max_tokens.codemods import ProtocolTransformer
from clamp_max_tokens.runtime import output_tokens_to_reserve
from toolkit.testing import assert_codemod

RELPATH = "entrypoints/openai/chat_completion/protocol.py"

# vLLM 0.30-0.32 (`max_output_tokens or 0`) and 0.33 (`max_output_tokens`)
BEFORE = '''
import json

from vllm.renderers import TokenizeParams


class ChatCompletionRequest(OpenAIBaseModel):
    max_tokens: int | None = None

    def build_tok_params(self, model_config: ModelConfig) -> TokenizeParams:
        max_output_tokens = self.max_tokens
        return TokenizeParams(
            max_total_tokens=model_config.max_model_len,
            max_output_tokens={value},
            truncate_prompt_tokens=self.truncate_prompt_tokens,
        )


class CompletionRequest(OpenAIBaseModel):
    def build_tok_params(self, model_config: ModelConfig) -> TokenizeParams:
        return TokenizeParams(max_total_tokens=model_config.max_model_len, max_output_tokens=self.max_tokens)
'''

AFTER = '''
import json
from clamp_max_tokens import runtime as _clamp_max_tokens  # toolkit:clamp-max-tokens

from vllm.renderers import TokenizeParams


class ChatCompletionRequest(OpenAIBaseModel):
    max_tokens: int | None = None

    def build_tok_params(self, model_config: ModelConfig) -> TokenizeParams:
        max_output_tokens = self.max_tokens
        return TokenizeParams(
            max_total_tokens=model_config.max_model_len,
            max_output_tokens=_clamp_max_tokens.output_tokens_to_reserve({value}, self.truncate_prompt_tokens),  # toolkit:clamp-max-tokens
            truncate_prompt_tokens=self.truncate_prompt_tokens,
        )


class CompletionRequest(OpenAIBaseModel):
    def build_tok_params(self, model_config: ModelConfig) -> TokenizeParams:
        return TokenizeParams(max_total_tokens=model_config.max_model_len, max_output_tokens=self.max_tokens)
'''


@pytest.mark.parametrize(("value", "engine_version"), [("max_output_tokens or 0", "0.32.0"),
                                                       ("max_output_tokens", "0.33.0")])
def test_the_argument_goes_through_the_runtime_in_chat_requests_only(value, engine_version):
    assert_codemod(ProtocolTransformer, BEFORE.format(value=value), AFTER.format(value=value),
                   engine_version=engine_version, relpath=RELPATH, patch_id="clamp-max-tokens")


def test_an_argument_on_the_calls_own_line_gets_the_marker_at_the_statements_end():
    before = '''
    import json


    class ChatCompletionRequest:
        def build_tok_params(self, model_config):
            return TokenizeParams(max_total_tokens=model_config.max_model_len, max_output_tokens=self.max_tokens)
    '''
    after = '''
    import json
    from clamp_max_tokens import runtime as _clamp_max_tokens  # toolkit:clamp-max-tokens


    class ChatCompletionRequest:
        def build_tok_params(self, model_config):
            return TokenizeParams(max_total_tokens=model_config.max_model_len, max_output_tokens=_clamp_max_tokens.output_tokens_to_reserve(self.max_tokens, self.truncate_prompt_tokens))  # toolkit:clamp-max-tokens
    '''
    assert_codemod(ProtocolTransformer, before, after, relpath=RELPATH, patch_id="clamp-max-tokens")


def test_a_release_without_the_argument_fails_on_its_anchor():
    before = '''
    import json


    class ChatCompletionRequest:
        def build_tok_params(self, model_config):
            return TokenizeParams(max_total_tokens=model_config.max_model_len)
    '''
    with pytest.raises(AssertionError, match="max_output_tokens"):
        assert_codemod(ProtocolTransformer, before, before, relpath=RELPATH, patch_id="clamp-max-tokens")


@pytest.mark.parametrize(("requested", "truncate", "reserved"), [
    (400, None, 1),     # the prompt check keeps one token free, not 400
    (1, None, 1),
    (0, None, 0),       # 0.30-0.32 send 0 for an unset max_tokens: unchanged
    (None, None, None),  # 0.33 sends None for an unset max_tokens: unchanged
    (400, -1, 400),     # truncation keeps the release's reservation: it decides where the prompt is cut
    (400, 100, 400),
])
def test_the_runtime_reserves_one_token_unless_the_request_truncates(requested, truncate, reserved):
    assert output_tokens_to_reserve(requested, truncate) == reserved
