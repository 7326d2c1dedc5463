"""harmony-stop-token-merge (prime-rl) on a snippet in vLLM 0.24's shape (the real file is
test_conformance.py's), and its behaviour: the patched method's merge, run with a harmony server's
defaults, with and without stop ids of the request. Runs without vLLM (the merge is plain Python;
the rest of the method, which builds vLLM's SamplingParams, is the release's own)."""

from __future__ import annotations

import textwrap

import pytest

from toolkit.testing import assert_codemod
from toolkit_catalog.vllm.harmony_stop_token_merge.codemods import MERGE, ChatCompletionRequestTransformer
from toolkit_catalog.vllm.harmony_stop_token_merge.patch import PATCH

RELPATH = "entrypoints/openai/chat_completion/protocol.py"

BEFORE = '''
class ChatCompletionRequest(OpenAIBaseModel):
    def to_sampling_params(self, max_tokens: int, default_sampling_params: dict) -> SamplingParams:
        extra_args: dict[str, Any] = self.vllm_xargs if self.vllm_xargs else {}
        if self.kv_transfer_params:
            # Pass in kv_transfer_params via extra_args
            extra_args["kv_transfer_params"] = self.kv_transfer_params
        return SamplingParams.from_optional(
            n=self.n,
            stop=self.stop,
            stop_token_ids=self.stop_token_ids,
            max_tokens=max_tokens,
        )


class CompletionRequest(OpenAIBaseModel):
    def to_sampling_params(self, max_tokens: int, default_sampling_params: dict) -> SamplingParams:
        return SamplingParams.from_optional(stop_token_ids=self.stop_token_ids)
'''

AFTER = '''
class ChatCompletionRequest(OpenAIBaseModel):
    def to_sampling_params(self, max_tokens: int, default_sampling_params: dict) -> SamplingParams:
        extra_args: dict[str, Any] = self.vllm_xargs if self.vllm_xargs else {}
        if self.kv_transfer_params:
            # Pass in kv_transfer_params via extra_args
            extra_args["kv_transfer_params"] = self.kv_transfer_params
        stop_token_ids = self.stop_token_ids  # toolkit:harmony-stop-token-merge
        default_stop_ids = default_sampling_params.get("stop_token_ids")  # toolkit:harmony-stop-token-merge
        if default_stop_ids:  # toolkit:harmony-stop-token-merge
            if not stop_token_ids:
                stop_token_ids = list(default_stop_ids)
            else:
                stop_token_ids = list(dict.fromkeys([*stop_token_ids, *default_stop_ids]))
        return SamplingParams.from_optional(
            n=self.n,
            stop=self.stop,
            stop_token_ids=stop_token_ids,
            max_tokens=max_tokens,
        )  # toolkit:harmony-stop-token-merge


class CompletionRequest(OpenAIBaseModel):
    def to_sampling_params(self, max_tokens: int, default_sampling_params: dict) -> SamplingParams:
        return SamplingParams.from_optional(stop_token_ids=self.stop_token_ids)
'''


def test_the_defaults_are_merged_before_the_return_and_completions_are_untouched():
    assert_codemod(ChatCompletionRequestTransformer, BEFORE, AFTER, engine_version="0.24.0", relpath=RELPATH,
                   patch_id=PATCH.id)


def test_vllm_0_25s_merged_call_fails_on_its_anchor_and_is_not_needed():
    fixed = BEFORE.replace("stop_token_ids=self.stop_token_ids,", "stop_token_ids=stop_token_ids,")
    with pytest.raises(AssertionError, match="return"):
        assert_codemod(ChatCompletionRequestTransformer, fixed, fixed, engine_version="0.25.0", relpath=RELPATH,
                       patch_id=PATCH.id)
    assert PATCH.not_needed_on("0.25.0") and not PATCH.not_needed_on("0.24.0")


HARMONY = {"stop_token_ids": [200012, 200002]}  # gpt-oss's <|call|> and <|return|>


@pytest.mark.parametrize(("requested", "merged"), [([], [200012, 200002]), ([7, 200002], [7, 200002, 200012]),
                                                   (None, [200012, 200002])])
def test_a_harmony_servers_stop_tokens_reach_the_request_in_order(requested, merged):
    from types import SimpleNamespace

    namespace = {"self": SimpleNamespace(stop_token_ids=requested), "default_sampling_params": HARMONY}
    exec("\n".join(textwrap.dedent(code) for code in MERGE), namespace)
    assert namespace["stop_token_ids"] == merged
