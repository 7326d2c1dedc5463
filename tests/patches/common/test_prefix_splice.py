"""The prefix splice (patches/common/prefix_splice.py) on the tiny model's real tokenizer and three
real chat-template shapes (tests/patches/common/chat_templates.py), rendered by transformers.

The engine tests (tests/patches/*/tito/test_splice*.py) drive the same logic through real servers;
here each property is checked on every template quickly: the prompt starts with the prefix ids, is
the plain templated prompt when re-rendering reproduces the prefix, continues with exactly what the
template puts after the last assistant turn, and a prefix the conversation does not extend is refused
with a message that says where they part.
"""

from __future__ import annotations

import pytest

from tests.patches.common.chat_templates import TEMPLATES, after_assistant
from toolkit.patches.common.prefix_splice import SpliceError, Template, prefix_from_messages, splice

pytestmark = pytest.mark.engine  # needs transformers (the dev venv has it)

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city.",
                                           "parameters": {"type": "object",
                                                          "properties": {"city": {"type": "string"}}}}}]
Q1 = {"role": "user", "content": "Name three prime numbers."}
Q2 = {"role": "user", "content": "And the next three?"}


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(tiny_model)


def template_for(tokenizer, name: str, tools=None) -> Template:
    def render(messages, add_generation_prompt):
        return tokenizer.apply_chat_template(
            messages, chat_template=TEMPLATES[name], tools=tools, tokenize=False,
            add_generation_prompt=True if add_generation_prompt is None else add_generation_prompt)

    return Template(render=render, encode=lambda text: tokenizer.encode(text, add_special_tokens=False),
                    decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False,
                                                        clean_up_tokenization_spaces=False))


def run(tokenizer, name, prefix, messages, tools=None):
    template = template_for(tokenizer, name, tools)
    text = template.render(messages, None)
    return splice(prefix, template.encode(text), text, messages, template)


def turn_one(tokenizer, name, generated_text: str, tools=None, end_of_turn=True) -> list[int]:
    """The ids of turn one as an engine saw and produced them: the templated prompt, then
    ``generated_text`` tokenized piecewise (one id per character: how a sampler may split a word,
    never how the tokenizer would), then the end-of-turn token."""
    template = template_for(tokenizer, name, tools)
    prompt = template.encode(template.render([Q1], None))
    generated = [tokenizer.convert_tokens_to_ids(t) for t in tokenizer.tokenize(generated_text)]
    pieces = []
    for token_id in generated:  # split every multi-character token into single bytes
        text = tokenizer.convert_ids_to_tokens(token_id)
        pieces += [tokenizer.convert_tokens_to_ids(ch) for ch in text] if len(text) > 1 and "<" not in text else [token_id]
    assert tokenizer.decode(pieces) == generated_text and pieces != generated
    end = [tokenizer.convert_tokens_to_ids("<|im_end|>")] if end_of_turn else []
    return prompt + pieces + end


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_unchanged_when_re_rendering_reproduces_the_prefix(tokenizer, name):
    template = template_for(tokenizer, name)
    reply = {"role": "assistant", "content": "2, 3 and 5."}
    conversation = [Q1, reply, Q2]
    plain = template.encode(template.render(conversation, None))
    # Turn one as the engine saw and wrote it: the templated ids up to the reply's end-of-turn token
    # (ChatML's <|im_end|>; the last id of Llama-3's "<|eot_id|>" text merges with what follows, so
    # the prefix stops before it).
    prefix = plain[: len(template.encode(template.render([Q1, reply], False))) - 1]
    result = run(tokenizer, name, prefix, conversation)
    assert result.how == "unchanged" and result.prompt == plain


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_drifted_tokenization_keeps_the_prefix_and_appends_the_template_rest(tokenizer, name):
    prefix = turn_one(tokenizer, name, "2, 3 and 5 are prime.", end_of_turn=name != "llama3")
    conversation = [Q1, {"role": "assistant", "content": "2, 3 and 5 are prime."}, Q2]
    result = run(tokenizer, name, prefix, conversation)
    assert result.prompt[: len(prefix)] == prefix
    tail = after_assistant(name, [Q2])
    if name != "llama3":
        tail = tail[len("<|im_end|>"):]  # the prefix ends with the generated <|im_end|>
    assert result.prompt[len(prefix):] == tokenizer.encode(tail, add_special_tokens=False)
    template = template_for(tokenizer, name)
    assert result.prompt != template.encode(template.render(conversation, None))  # re-templating drifts


def test_template_that_drops_earlier_reasoning_keeps_it_in_the_prefix(tokenizer):
    generated = "<think>\nsmall primes\n</think>\n\n2, 3 and 5."
    prefix = turn_one(tokenizer, "qwen3-drop", generated)
    reply = {"role": "assistant", "reasoning": "small primes", "content": "2, 3 and 5."}
    result = run(tokenizer, "qwen3-drop", prefix, [Q1, reply, Q2])
    assert result.how == "template"
    assert result.prompt == prefix + tokenizer.encode(
        "\n<|im_start|>user\nAnd the next three?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    assert "small primes" in tokenizer.decode(result.prompt)  # the re-rendered prompt has lost it
    assert "small primes" not in template_for(tokenizer, "qwen3-drop").render([Q1, reply, Q2], None)


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_tool_call_turn_then_tool_result(tokenizer, name):
    """The model wrote its tool call its own way (spacing); the template re-serializes it."""
    generated = '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris"}}\n</tool_call>'
    prefix = turn_one(tokenizer, name, generated, tools=TOOLS)
    call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    result_message = {"role": "tool", "tool_call_id": "c1", "content": "sunny, 21 C"}
    conversation = [Q1, {"role": "assistant", "content": "", "tool_calls": [call]}, result_message]
    result = run(tokenizer, name, prefix, conversation, tools=TOOLS)
    assert result.how == "template"
    tail = after_assistant(name, [result_message])
    expected = tokenizer.encode(tail, add_special_tokens=False)
    if name != "llama3":
        expected = expected[1:]  # the generated <|im_end|> is the template's own end of turn
    assert result.prompt == prefix + expected


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_a_prefix_the_conversation_does_not_extend_is_refused_saying_where(tokenizer, name):
    prefix = turn_one(tokenizer, name, "2, 3 and 5 are prime.")
    other = [{"role": "user", "content": "Name three colours."},
             {"role": "assistant", "content": "2, 3 and 5 are prime."}, Q2]
    with pytest.raises(SpliceError) as info:
        run(tokenizer, name, prefix, other)
    message = str(info.value)
    assert "messages[0] (user) 'Name three colours.' is not in the prefix's text after character 0" in message
    assert info.value.parameter == "prefix_token_ids"


def test_no_assistant_message_and_no_text_prefix_is_refused(tokenizer):
    prefix = tokenizer.encode("<|begin_of_text|><|im_start|>system\nhello", add_special_tokens=False)
    with pytest.raises(SpliceError, match=r"no assistant message to splice after: they part at token 2"):
        run(tokenizer, "chatml-think", prefix, [Q1])


def test_nemo_gym_ids_on_the_last_assistant_message():
    messages = [Q1, {"role": "assistant", "content": "a", "prompt_token_ids": [1, 2], "generation_token_ids": [3]},
                Q2, {"role": "assistant", "content": "b", "prompt_token_ids": [1, 2, 3, 4], "generation_token_ids": [5]},
                Q2]
    assert prefix_from_messages(messages) == [1, 2, 3, 4, 5]
    assert prefix_from_messages([Q1]) is None


def test_the_fast_codec_gives_the_tokenizers_own_ids_and_text(tokenizer):
    from toolkit.patches.common.prefix_splice import tokenizer_codec

    encode, decode = tokenizer_codec(tokenizer)
    text = "<|im_start|>user\nWeather in Paris?<|im_end|>\n<tool_call>\n{\"a\": 1}\n</tool_call> café ✓"
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert encode(text) == ids
    assert decode(ids) == tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False) == text
