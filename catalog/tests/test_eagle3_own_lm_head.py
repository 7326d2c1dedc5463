"""eagle3-own-lm-head (NeMo-RL) on a snippet in vLLM 0.24-0.33's shape (the real files are
test_conformance.py's). Runs without vLLM.

No behaviour test here: the drafter is built only with a speculative config and a Llama EAGLE-3
checkpoint on a GPU worker (vLLM's CPU backend does not run EAGLE-3 drafting)."""

from __future__ import annotations

import pytest

from toolkit.testing import assert_codemod
from toolkit_catalog.vllm.eagle3_own_lm_head.codemods import Eagle3Transformer
from toolkit_catalog.vllm.eagle3_own_lm_head.patch import PATCH

RELPATH = "model_executor/models/llama_eagle3.py"

BEFORE = '''
class Eagle3LlamaForCausalLM(LlamaForCausalLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        logit_scale = getattr(self.config, "logit_scale", 1.0)
        self.lm_head = ParallelLMHead(
            self.config.draft_vocab_size,
            self.config.hidden_size,
            quant_config=get_draft_quant_config(vllm_config),
            prefix=maybe_prefix(prefix, "lm_head"),
        )
        self.logits_processor = LogitsProcessor(
            self.config.draft_vocab_size, scale=logit_scale
        )


class LlamaModel(nn.Module):
    def __init__(self):
        self.lm_head = ParallelLMHead(self.config.draft_vocab_size, 1)
'''

AFTER = '''
class Eagle3LlamaForCausalLM(LlamaForCausalLM):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        logit_scale = getattr(self.config, "logit_scale", 1.0)
        self.lm_head = ParallelLMHead(
            self.config.draft_vocab_size,
            self.config.hidden_size,
            quant_config=get_draft_quant_config(vllm_config),
            prefix=maybe_prefix(prefix, "lm_head"),
        )
        self.has_own_lm_head = (  # toolkit:eagle3-own-lm-head
            self.config.draft_vocab_size != self.config.vocab_size
        )
        self.logits_processor = LogitsProcessor(
            self.config.draft_vocab_size, scale=logit_scale
        )


class LlamaModel(nn.Module):
    def __init__(self):
        self.lm_head = ParallelLMHead(self.config.draft_vocab_size, 1)
'''


def test_ownership_follows_the_head_and_other_classes_are_untouched():
    assert_codemod(Eagle3Transformer, BEFORE, AFTER, engine_version="0.33.0", relpath=RELPATH, patch_id=PATCH.id)


def test_a_head_over_the_full_vocabulary_is_not_the_anchor():
    before = BEFORE.replace("            self.config.draft_vocab_size,\n            self.config.hidden_size",
                            "            self.config.vocab_size,\n            self.config.hidden_size")
    with pytest.raises(AssertionError, match="lm-head"):
        assert_codemod(Eagle3Transformer, before, before, relpath=RELPATH, patch_id=PATCH.id)
