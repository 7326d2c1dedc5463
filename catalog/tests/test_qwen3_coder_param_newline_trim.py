"""qwen3-coder-param-newline-trim (prime-rl) on a snippet in vLLM 0.24-0.25's shape (the real files are
test_conformance.py's), and its behaviour: the patched converter, run on a tool call whose argument is
indented code, keeps the indentation the release's strip() loses. Runs without vLLM."""

from __future__ import annotations

import json
import textwrap

import pytest

from toolkit.testing import assert_codemod
from toolkit_catalog.vllm.qwen3_coder_param_newline_trim.codemods import Qwen3ParserTransformer
from toolkit_catalog.vllm.qwen3_coder_param_newline_trim.patch import PATCH

RELPATH = "parser/qwen3.py"

HEAD = '''
import json

import re

_PARAM_RE = re.compile(
    r"<\\s*parameter\\s*=\\s*([^>]*)>"
    r"(.*?)"
    r"(?:<\\s*/\\s*parameter\\s*>|(?=<\\s*parameter\\s*=))",
    re.DOTALL,
)
_PARTIAL_PARAM_RE = re.compile(r"<\\s*parameter\\s*=\\s*([^>]+)>(.*)$", re.DOTALL)
'''

CONVERTER = '''

def _qwen3_arg_converter(raw_args: str, partial: bool) -> str:
    params: dict[str, object] = {{}}

    for match in _PARAM_RE.finditer(raw_args):
        name = match.group(1)
        value = match.group(2)
        params[name] = {first}

    if partial:
        remaining = _PARAM_RE.sub("", raw_args)
        m = _PARTIAL_PARAM_RE.search(remaining)
        if m:
            name = m.group(1)
            value = m.group(2)
            if name:
                params[name] = {second}

    return json.dumps(params, ensure_ascii=False)


def keep(value):
    return value.strip()
'''

BEFORE = HEAD + CONVERTER.format(first="value.strip()", second="value.strip()")

AFTER = HEAD + '''

def _trim_wrapping_newlines(value: str) -> str:  # toolkit:qwen3-coder-param-newline-trim
    """Strip one leading and one trailing newline (the Qwen3 template markup)."""
    if value.startswith("\\n"):
        value = value[1:]
    if value.endswith("\\n"):
        value = value[:-1]
    return value
''' + CONVERTER.format(first="_trim_wrapping_newlines(value)  # toolkit:qwen3-coder-param-newline-trim",
                       second="_trim_wrapping_newlines(value)  # toolkit:qwen3-coder-param-newline-trim")


def test_each_strip_of_the_converter_trims_one_newline_and_the_helper_is_added():
    # `keep`'s strip() is not the converter's: untouched
    assert_codemod(Qwen3ParserTransformer, BEFORE, AFTER, engine_version="0.24.0", relpath=RELPATH,
                   patch_id=PATCH.id)


def test_vllm_0_26s_fixed_converter_fails_on_its_anchor_and_is_not_needed():
    fixed = HEAD + CONVERTER.format(first="_trim_wrapping_newlines(value)", second="_trim_wrapping_newlines(value)")
    with pytest.raises(AssertionError, match="strip"):
        assert_codemod(Qwen3ParserTransformer, fixed, fixed, engine_version="0.26.0", relpath=RELPATH,
                       patch_id=PATCH.id)
    assert PATCH.not_needed_on("0.26.0") and not PATCH.not_needed_on("0.25.1")


def _converter(code: str):
    namespace: dict = {}
    exec(compile(textwrap.dedent(code), RELPATH, "exec"), namespace)
    return namespace["_qwen3_arg_converter"]


CALL = ("<parameter=old_str>\n    return x\n</parameter><parameter=new_str>\n    return y\n\n</parameter>"
        "<parameter=path>\nsrc/a.py\n")


def test_indented_arguments_keep_their_indentation_where_the_release_strips_it():
    release, patched = _converter(BEFORE), _converter(AFTER)
    assert json.loads(release(CALL, True)) == {"old_str": "return x", "new_str": "return y", "path": "src/a.py"}
    assert json.loads(patched(CALL, True)) == {"old_str": "    return x", "new_str": "    return y\n",
                                               "path": "src/a.py"}
