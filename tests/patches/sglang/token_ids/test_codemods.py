"""The token-ids codemods: golden before/after snippets, missing anchors, and the real SGLang sources."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from toolkit.patches.sglang.token_ids.patch import PATCH
from tests.harness.fixtures import ensure_source_tree
from toolkit.errors import AnchorError
from toolkit.engine.transform import transform_or_raise

PROTOCOL, SERVING_CHAT = PATCH.files
VERSIONS = ("0.5.9", "0.5.23")


def patched(edit, before: str, version: str = "0.5.9") -> str:
    return transform_or_raise(PATCH, edit, textwrap.dedent(before), version).after


# --------------------------------------------------------------------------------------------------
# protocol.py

PROTOCOL_BEFORE = '''
import time
from typing import Any, Dict, List, Optional

from pydantic import BaseModel, Field, model_serializer


class ChatCompletionRequest(BaseModel):
    messages: List[Dict[str, Any]]
    stream: bool = False
    separate_reasoning: bool = True

    def to_sampling_params(self) -> Dict[str, Any]:
        return {}


class ChatCompletionResponseChoice(BaseModel):
    index: int
    finish_reason: Optional[str] = None
    hidden_states: Optional[object] = None

    @model_serializer(mode="wrap")
    def _serialize(self, handler):
        data = handler(self)
        if self.hidden_states is None:
            data.pop("hidden_states", None)
        return data


class ChatCompletionResponse(BaseModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    choices: List[ChatCompletionResponseChoice]

    @model_serializer(mode="wrap")
    def _serialize(self, handler):
        data = handler(self)
        return data
'''

PROTOCOL_AFTER = '''
import time
from toolkit.patches.sglang.token_ids import runtime as _toolkit_token_ids  # toolkit:token-ids
from typing import Any, Dict, List, Optional

from pydantic import BaseModel, Field, model_serializer


class ChatCompletionRequest(BaseModel):
    messages: List[Dict[str, Any]]
    stream: bool = False
    separate_reasoning: bool = True
    return_token_ids: bool = False  # toolkit:token-ids

    def to_sampling_params(self) -> Dict[str, Any]:
        return {}


class ChatCompletionResponseChoice(BaseModel):
    index: int
    finish_reason: Optional[str] = None
    hidden_states: Optional[object] = None
    token_ids: list[int] | None = None  # toolkit:token-ids

    @model_serializer(mode="wrap")
    @_toolkit_token_ids.omit_when_none("token_ids")  # toolkit:token-ids
    def _serialize(self, handler):
        data = handler(self)
        if self.hidden_states is None:
            data.pop("hidden_states", None)
        return data


class ChatCompletionResponse(BaseModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    choices: List[ChatCompletionResponseChoice]
    prompt_token_ids: list[int] | None = None  # toolkit:token-ids

    @model_serializer(mode="wrap")
    @_toolkit_token_ids.omit_when_none("prompt_token_ids")  # toolkit:token-ids
    def _serialize(self, handler):
        data = handler(self)
        return data
'''


def test_protocol_gets_the_request_flag_and_the_response_fields():
    assert patched(PROTOCOL, PROTOCOL_BEFORE) == PROTOCOL_AFTER


def test_protocol_keeps_a_return_token_ids_field_the_engine_already_has():
    # 0.5.23 declares its own return_token_ids (non-streaming response_token_ids); ours is the same flag.
    before = PROTOCOL_BEFORE.replace(
        "    separate_reasoning: bool = True\n",
        "    separate_reasoning: bool = True\n    return_token_ids: bool = False\n",
    )
    after = PROTOCOL_AFTER.replace(
        "    return_token_ids: bool = False  # toolkit:token-ids\n", "    return_token_ids: bool = False\n"
    )
    assert patched(PROTOCOL, before, "0.5.23") == after


def test_protocol_keeps_a_token_ids_choice_field_the_engine_already_has():
    # 0.5.17 declares its own ChatCompletionResponseChoice.token_ids (and drops it when None): no second
    # field, its serializer left as the release wrote it
    own = """    hidden_states: Optional[object] = None
    token_ids: Optional[List[int]] = None

    @model_serializer(mode="wrap")
    def _serialize(self, handler):
        data = handler(self)
        if self.hidden_states is None:
            data.pop("hidden_states", None)
        if self.token_ids is None:
            data.pop("token_ids", None)
        return data
"""
    choice = PROTOCOL_BEFORE[PROTOCOL_BEFORE.index("    hidden_states"):PROTOCOL_BEFORE.index("\n\nclass ChatCompletionResponse(")]
    before = PROTOCOL_BEFORE.replace(choice, own.rstrip("\n"))
    after = patched(PROTOCOL, before, "0.5.17")
    assert own in after and after.count("\n    token_ids: ") == 1
    assert "omit_when_none(\"token_ids\")" not in after and "omit_when_none(\"prompt_token_ids\")" in after


def test_protocol_without_a_response_serializer_names_the_missing_anchor():
    before = PROTOCOL_BEFORE.replace(
        '''    choices: List[ChatCompletionResponseChoice]

    @model_serializer(mode="wrap")
    def _serialize(self, handler):
        data = handler(self)
        return data
''',
        "    choices: List[ChatCompletionResponseChoice]\n",
    )
    with pytest.raises(AnchorError, match=r"ChatCompletionResponse\.serializer .* not found") as error:
        patched(PROTOCOL, before)
    assert error.value.relpath == "srt/entrypoints/openai/protocol.py"


def test_protocol_with_the_request_class_twice_is_ambiguous():
    before = PROTOCOL_BEFORE + "\n\nclass ChatCompletionRequest(BaseModel):\n    stream: bool = False\n"
    with pytest.raises(AnchorError, match=r"anchor ChatCompletionRequest .* found 2 times"):
        patched(PROTOCOL, before)


# --------------------------------------------------------------------------------------------------
# serving_chat.py

SERVING_BEFORE = '''
from __future__ import annotations

import time

from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase


class OpenAIServingChat(OpenAIServingBase):
    def _convert_to_internal_request(self, request, raw_request=None):
        if request.stream:
            if request.return_prompt_token_ids:
                raise ValueError("return_prompt_token_ids is not supported with streaming.")
            if request.return_token_ids:
                raise ValueError("return_token_ids is not supported with streaming.")
        return GenerateReqInput(input_ids=request.input_ids, stream=request.stream), request

    async def _generate_chat_stream(self, adapted_request, request, raw_request):
        """Generate streaming chat completion response"""
        async for content in self.tokenizer_manager.generate_request(
            adapted_request, raw_request
        ):
            yield f"data: {content['text']}\\n\\n"
        yield "data: [DONE]\\n\\n"

    async def _handle_non_streaming_request(self, adapted_request, request, raw_request):
        ret = await self.tokenizer_manager.generate_request(
            adapted_request, raw_request
        ).__anext__()
        if not isinstance(ret, list):
            ret = [ret]

        response = self._build_chat_response(
            request,
            ret,
            int(time.time()),
        )

        return response
'''

SERVING_AFTER_0_5_23 = '''
from __future__ import annotations

import time
from toolkit.patches.sglang.token_ids import runtime as _toolkit_token_ids  # toolkit:token-ids

from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase


class OpenAIServingChat(OpenAIServingBase):
    def _convert_to_internal_request(self, request, raw_request=None):
        if request.stream:
            if request.return_prompt_token_ids:
                raise ValueError("return_prompt_token_ids is not supported with streaming.")
            pass  # toolkit:token-ids: stream requests may set return_token_ids
        return GenerateReqInput(input_ids=request.input_ids, stream=request.stream), request

    @_toolkit_token_ids.stream_token_ids  # toolkit:token-ids
    async def _generate_chat_stream(self, adapted_request, request, raw_request):
        """Generate streaming chat completion response"""
        async for content in _toolkit_token_ids.tap(self.tokenizer_manager.generate_request(
            adapted_request, raw_request
        )):  # toolkit:token-ids
            yield f"data: {content['text']}\\n\\n"
        yield "data: [DONE]\\n\\n"

    async def _handle_non_streaming_request(self, adapted_request, request, raw_request):
        ret = await self.tokenizer_manager.generate_request(
            adapted_request, raw_request
        ).__anext__()
        if not isinstance(ret, list):
            ret = [ret]

        response = _toolkit_token_ids.add_to_response(self._build_chat_response(
            request,
            ret,
            int(time.time()),
        ), request, adapted_request, ret)  # toolkit:token-ids

        return response
'''

# 0.5.9 has no return_token_ids of its own, hence no check rejecting it on streams.
STREAM_CHECK = '''            if request.return_token_ids:
                raise ValueError("return_token_ids is not supported with streaming.")
'''
SERVING_BEFORE_0_5_9 = SERVING_BEFORE.replace(STREAM_CHECK, "")
SERVING_AFTER_0_5_9 = SERVING_AFTER_0_5_23.replace(
    "            pass  # toolkit:token-ids: stream requests may set return_token_ids\n", ""
)


def test_serving_chat_wraps_the_stream_taps_the_engine_and_fills_the_response():
    assert patched(SERVING_CHAT, SERVING_BEFORE_0_5_9, "0.5.9") == SERVING_AFTER_0_5_9


def test_serving_chat_lets_0_5_23_stream_requests_ask_for_return_token_ids():
    assert patched(SERVING_CHAT, SERVING_BEFORE, "0.5.23") == SERVING_AFTER_0_5_23


def test_serving_chat_reading_its_own_return_token_ids_without_the_stream_check_names_the_anchor():
    # chosen by what the code reads, not by the version: a release with its own flag must have the check
    before = SERVING_BEFORE_0_5_9.replace("stream=request.stream)", "stream=request.stream, "
                                          "return_prompt_token_ids=request.return_token_ids)")
    assert before != SERVING_BEFORE_0_5_9
    with pytest.raises(AnchorError, match=r"stream-return-token-ids-check .* not found") as error:
        patched(SERVING_CHAT, before, "0.5.9")
    assert error.value.engine_version == "0.5.9"


@pytest.mark.parametrize(
    "change,anchor",
    [
        (("async def _generate_chat_stream(self, adapted_request, request,",
          "async def _generate_chat_stream(self, generate_input, request,"), "_generate_chat_stream"),
        (("self.tokenizer_manager.generate_request(\n            adapted_request, raw_request\n        ):",
          "self.engine.generate(\n            adapted_request, raw_request\n        ):"), "engine-outputs"),
        (("response = self._build_chat_response(", "response = self._make_chat_response("),
         "_build_chat_response-call"),
    ],
)
def test_serving_chat_missing_structure_names_its_anchor(change, anchor):
    before = SERVING_BEFORE_0_5_9.replace(*change)
    assert before != SERVING_BEFORE_0_5_9
    with pytest.raises(AnchorError, match=rf"anchor {anchor} .* not found"):
        patched(SERVING_CHAT, before)


def test_a_module_without_imports_names_the_runtime_import_anchor():
    before = SERVING_BEFORE_0_5_9.replace("import time\n", "").replace(
        "from sglang.srt.entrypoints.openai.serving_base import OpenAIServingBase\n", "OpenAIServingBase = object\n"
    )
    with pytest.raises(AnchorError, match=r"anchor runtime-import .* not found"):
        patched(SERVING_CHAT, before)


def test_only_openai_serving_chat_is_edited():
    other = SERVING_BEFORE_0_5_9.replace("class OpenAIServingChat(", "class OpenAIServingOther(")
    with pytest.raises(AnchorError, match=r"anchor _generate_chat_stream .* not found"):
        patched(SERVING_CHAT, other)


# --------------------------------------------------------------------------------------------------
# the real sources of every supported version


def source_tree(version: str) -> Path:
    """``sglang==version`` unpacked by scripts/fetch_sources.py (site-packages-like)."""
    return ensure_source_tree("sglang", version)


# import, request field (0.5.9 only), two response fields and their two serializer decorators
# / import, stream decorator, engine tap, response wrap, stream check (0.5.23 only)
MARKED_EDITS = {
    (PROTOCOL.relpath, "0.5.9"): 6,
    (PROTOCOL.relpath, "0.5.23"): 5,
    (SERVING_CHAT.relpath, "0.5.9"): 4,
    (SERVING_CHAT.relpath, "0.5.23"): 5,
}


@pytest.mark.parametrize("version", VERSIONS)
def test_real_sources_find_every_anchor_once_and_compile(version):
    assert PATCH.supports(version)
    tree = source_tree(version)
    for edit in PATCH.files:
        source = (tree / "sglang" / edit.relpath).read_text()
        result = transform_or_raise(PATCH, edit, source, version)  # raises on any anchor; compiles
        assert result.anchors and all(anchor.count == 1 for _, anchor in result.anchors), result.anchors
        # every changed line is recognisably ours: the marker, or the call into the runtime that a
        # multi-line statement starts with (its marker ends the statement)
        added = set(result.after.splitlines()) - set(source.splitlines())
        assert added and all("# toolkit:token-ids" in line or "_toolkit_token_ids." in line for line in added)
        assert result.after.count("# toolkit:token-ids") == MARKED_EDITS[edit.relpath, version]


def test_real_0_5_23_keeps_its_own_return_token_ids_and_drops_only_its_stream_check():
    tree = source_tree("0.5.23")
    protocol = transform_or_raise(PATCH, PROTOCOL, (tree / "sglang" / PROTOCOL.relpath).read_text(), "0.5.23").after
    assert "return_token_ids: bool = False  # toolkit:token-ids" not in protocol
    serving = transform_or_raise(PATCH, SERVING_CHAT, (tree / "sglang" / SERVING_CHAT.relpath).read_text(), "0.5.23")
    assert "return_token_ids is not supported with streaming" not in serving.after
    assert "return_prompt_token_ids is not supported with streaming" in serving.after
