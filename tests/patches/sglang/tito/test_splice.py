"""Prefix splice on SGLang's real ``OpenAIServingChat``, 0.5.9 and 0.5.23, token-ids and tito applied.

``splice_driver.py`` runs on a private copy of each venv's ``sglang`` (in the process of that patch state
shared with the tito serving tests: tests/patches/sglang/group_runs.py): two-turn conversations under
three chat templates (tests/patches/common/chat_templates.py), turn one answered by the scripted
tokenizer manager in single-character ids (re-tokenizing them drifts), turn two carrying turn one's
ids. Every expected rest of a prompt is written by hand (``after_assistant``), independently of the
patch's code; the prompt the engine got must start with the prefix exactly and continue with it.
"""

from __future__ import annotations


import pytest

from tests.harness.fixtures import ensure_tiny_model
from tests.patches.common.chat_templates import TEMPLATES, after_assistant
from tests.patches.sglang.group_runs import SPLICE_RELEASES, group_runs
from tests.patches.sglang.token_ids.test_serving import body, streamed_ids

pytestmark = pytest.mark.engine

Q2 = {"role": "user", "content": "And the next three?"}
EOS = 3  # the tiny tokenizer's <|im_end|>


@pytest.fixture(scope="module", params=SPLICE_RELEASES)
def cases(request, tmp_path_factory) -> dict:
    """The splice driver's cases with token-ids and tito applied, run in that patch state's process of
    the release group's shared runs (tests/patches/sglang/group_runs.py)."""
    splice = group_runs(request.param, tmp_path_factory).splice
    assert splice is not None, f"group_runs ran no splice cases on {request.param}"
    return splice["cases"]


@pytest.fixture(scope="module")
def tokenizer():
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(ensure_tiny_model())


def expected_rest(tokenizer, template: str, prefix: list[int], new: list[dict]) -> list[int]:
    """What the template puts after the prefix (its end of turn once: the prefix ends with EOS)."""
    tail = tokenizer.encode(after_assistant(template, new), add_special_tokens=False)
    return tail[1:] if prefix[-1] == EOS and tail[0] == EOS else tail


def prompt_of(case: dict, stream: bool) -> list[int]:
    """The prompt the engine got, which the response echoes."""
    (engine,) = case["engine"]
    echoed = streamed_ids(case)[0] if stream else body(case)["prompt_token_ids"]
    assert echoed == engine
    return engine


@pytest.mark.parametrize("template", sorted(TEMPLATES))
@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
def test_prompt_is_the_prefix_then_the_template_rest(cases, tokenizer, template, stream):
    case = cases[f"{template}/drift/{'stream' if stream else 'nonstream'}"]
    prompt = prompt_of(case, stream)
    prefix = case["prefix"]
    assert prompt[: len(prefix)] == prefix
    assert prompt[len(prefix):] == expected_rest(tokenizer, template, prefix, [Q2])
    plain = tokenizer.apply_chat_template(case["messages"], chat_template=TEMPLATES[template], tokenize=True,
                                          add_generation_prompt=True, return_dict=False)
    assert prompt != list(plain)  # re-templating would have drifted


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_no_change_when_re_rendering_reproduces_the_prefix(cases, template):
    spliced, plain = cases[f"{template}/unchanged"], cases[f"{template}/plain_of_unchanged"]
    assert spliced["engine"] == plain["engine"]
    assert spliced["engine"][0][: len(spliced["prefix"])] == spliced["prefix"]


@pytest.mark.parametrize("template", sorted(TEMPLATES))
@pytest.mark.parametrize("stream", [False, True], ids=["nonstream", "stream"])
def test_n2_and_stop_strings_with_the_splice(cases, template, stream):
    s = "stream" if stream else "nonstream"
    case, drift = cases[f"{template}/n2_stop/{s}"], cases[f"{template}/drift/{s}"]
    assert prompt_of(case, stream) == drift["engine"][0]
    assert "Seven" in case["stop"][0]  # the stop string reaches the engine
    if not stream:
        choices = body(case)["choices"]
        assert sorted(c["index"] for c in choices) == [0, 1]
        assert choices[0]["token_ids"] != choices[1]["token_ids"]


def test_template_that_drops_reasoning_keeps_it(cases, tokenizer):
    case = cases["qwen3-drop/reasoning"]
    assert case["messages"][1]["reasoning_content"].strip() == "small primes"
    prompt = prompt_of(case, False)
    prefix = case["prefix"]
    assert prompt == prefix + expected_rest(tokenizer, "qwen3-drop", prefix, [Q2])
    assert "small primes" in tokenizer.decode(prompt)


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_tool_call_turn_then_tool_result(cases, tokenizer, template):
    case = cases[f"{template}/tool_call"]
    assert case["messages"][1]["tool_calls"][0]["function"]["name"] == "get_weather"
    prompt = prompt_of(case, False)
    prefix = case["prefix"]
    assert prompt == prefix + expected_rest(tokenizer, template, prefix, [case["messages"][2]])


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_a_prefix_the_conversation_does_not_extend_is_a_400_saying_where(cases, template):
    case = cases[f"{template}/mismatch"]
    assert case["status"] == 400 and case["engine"] == []
    assert "messages[0] (user) 'Name three colours.' is not in the prefix's text after character 0" in case["body"]


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_peer_field_names_give_the_same_prompt(cases, template):
    ours = cases[f"{template}/drift/nonstream"]["engine"]
    assert cases[f"{template}/required_prefix"]["engine"] == ours
    assert cases[f"{template}/nemo_gym"]["engine"] == ours


@pytest.mark.parametrize("template", sorted(TEMPLATES))
def test_tokens_field_is_the_exact_prompt(cases, template):
    case = cases[f"{template}/tokens"]
    assert prompt_of(case, False) == case["prefix"]
