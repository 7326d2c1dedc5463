"""The families' real tokenizers and chat templates (scripts/support/family_tokenizers.py), on the cached family
models: added-token ids, the published example ids, round trips, and the published template's rendering of a
tool call and of reasoning turns. Server-less; seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.support import family_tokenizers as ft
from tests.harness.fixtures import ensure_family_model

WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                 "parameters": {"type": "object",
                                                                "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def qwen3():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_family_model("qwen3"))


def test_qwen3_has_its_26_added_tokens_at_their_ids_and_the_published_encodings(qwen3):
    ft.check("qwen3", qwen3)  # ids 151643-151668, which are special, "Hello, world!", the published chat's ids
    assert len(qwen3) == 151669
    assert qwen3.convert_tokens_to_ids(["<think>", "</think>", "<tool_call>", "</tool_call>"]) == \
        [151667, 151668, 151657, 151658]
    assert "<think>" not in qwen3.all_special_tokens and "<|im_end|>" in qwen3.all_special_tokens


def test_qwen3_moe_has_the_same_tokenizer():
    a = ensure_family_model("qwen3")
    b = ensure_family_model("qwen3-moe")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (Path(a) / name).read_bytes() == \
            (Path(b) / name).read_bytes(), name


def test_qwen3_round_trips_text_and_markers(qwen3):
    for text in [*ft.SAMPLES, "<|im_start|>user\nhi<|im_end|>", "x<think>y</think>z"]:
        ids = qwen3.encode(text, add_special_tokens=False)
        assert qwen3.decode(ids) == ft.unicodedata_nfc(text)


def test_qwen3_template_renders_a_tool_call_and_its_result_as_published(qwen3):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"type": "function", "id": "c1", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    text = qwen3.apply_chat_template(messages, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n\nYou may call one or more functions")
    assert "<tools>\n" + json.dumps(WEATHER_TOOL) + "\n</tools>" in text
    # an assistant turn with no reasoning that is not the last message gets no think block
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call><|im_end|>\n') in text
    assert text.endswith("<|im_start|>user\n<tool_response>\nsunny\n</tool_response><|im_end|>\n"
                         "<|im_start|>assistant\n")
    ids = qwen3.apply_chat_template(messages, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=True)
    assert 151657 in ids and 151658 in ids and 151665 in ids  # <tool_call>, </tool_call>, <tool_response>


def test_qwen3_template_drops_the_reasoning_of_turns_before_the_last_user_query(qwen3):
    messages = [{"role": "user", "content": "2+2?"},
                {"role": "assistant", "content": "4", "reasoning_content": "add them"},
                {"role": "user", "content": "and 3+3?"},
                {"role": "assistant", "content": "<think>\nadd again\n</think>\n\n6"}]
    text = qwen3.apply_chat_template(messages, tokenize=False)
    assert "add them" not in text and "<|im_start|>assistant\n4<|im_end|>" in text
    assert text.endswith("<|im_start|>assistant\n<think>\nadd again\n</think>\n\n6<|im_end|>\n")
    off = qwen3.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=False, enable_thinking=False)
    assert off.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_every_family_model_names_its_tokenizer_and_passes_its_checks():
    from transformers import AutoTokenizer

    from scripts.support.load import load_script

    builder = load_script("make_family_model.py", "_toolkit_make_family_model")
    for family in sorted(builder.FAMILIES):
        model_dir = ensure_family_model(family)
        meta = json.loads((Path(model_dir) / "family.json").read_text())
        ft.check(meta["tokenizer"], AutoTokenizer.from_pretrained(model_dir))


def test_bytes_other_than_the_pinned_ones_are_refused(tmp_path, monkeypatch):
    (tmp_path / "qwen3").mkdir()
    (tmp_path / "qwen3" / "chat_template.jinja").write_text("{{ messages }}")
    (tmp_path / "qwen3" / "PINNED.json").write_text(json.dumps(
        {"files": [{"file": "chat_template.jinja", "sha256": "0" * 64}]}))
    monkeypatch.setattr(ft, "PINNED_DIR", tmp_path)
    with pytest.raises(ft.TokenizerError, match="sha256"):
        ft.pinned_file("qwen3", "chat_template.jinja")
    with pytest.raises(ft.TokenizerError, match="pins no"):
        ft.pinned_file("qwen3", "other.json")
