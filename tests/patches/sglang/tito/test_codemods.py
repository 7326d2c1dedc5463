"""The SGLang tito codemods: golden before/after snippets, missing anchors, composition with token-ids
in either order, and the real sources of SGLang 0.5.9 and 0.5.23 (every anchor once, compiles,
injected names bound, apply/revert byte-identical on a copy, alone and together with token-ids)."""

from __future__ import annotations

import ast
import hashlib
import shutil
import textwrap
from pathlib import Path

import pytest

from toolkit.patches.sglang.tito.patch import PATCH
from toolkit.patches.sglang.token_ids.patch import PATCH as TOKEN_IDS
from tests.harness.fixtures import ensure_source_tree
from toolkit.engine import patching as engine
from toolkit.errors import AnchorError
from toolkit.engine.sources import load_source
from toolkit.engine.transform import transform_or_raise
from tests.harness import by_id

PROTOCOL, SERVING_CHAT, HTTP_SERVER = PATCH.files
VERSIONS = ("0.5.9", "0.5.23")


def patched(edit, before: str, version: str = "0.5.9") -> str:
    return transform_or_raise(PATCH, edit, textwrap.dedent(before), version).after


# --------------------------------------------------------------------------------------------------
# protocol.py

PROTOCOL_BEFORE = '''
import time
from typing import Any, Dict, List, Optional

from pydantic import BaseModel, Field, model_serializer, model_validator


class TopLogprob(BaseModel):
    token: str
    bytes: List[int]
    logprob: float


class ChatCompletionTokenLogprob(BaseModel):
    token: str
    bytes: List[int]
    logprob: float
    top_logprobs: List[TopLogprob]


class ChatCompletionRequest(BaseModel):
    messages: List[Dict[str, Any]]
    stream: bool = False

    @model_validator(mode="before")
    @classmethod
    def set_tool_choice_default(cls, values):
        return values


class ChatCompletionResponse(BaseModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))

    @model_serializer(mode="wrap")
    def _serialize(self, handler):
        return handler(self)
'''

PROTOCOL_AFTER = '''
import time
from toolkit.patches.sglang.tito import runtime as _toolkit_tito  # toolkit:tito
from typing import Any, Dict, List, Optional

from pydantic import BaseModel, Field, model_serializer, model_validator


class TopLogprob(BaseModel):
    token: str
    token_id: Optional[int] = None  # toolkit:tito
    bytes: List[int]
    logprob: float


class ChatCompletionTokenLogprob(BaseModel):
    token: str
    token_id: Optional[int] = None  # toolkit:tito
    bytes: List[int]
    logprob: float
    top_logprobs: List[TopLogprob]


class ChatCompletionRequest(BaseModel):
    messages: List[Dict[str, Any]]
    stream: bool = False
    input_ids: Optional[List[int]] = None  # toolkit:tito
    logprob_start_len: Optional[int] = None  # toolkit:tito
    prefix_token_ids: Optional[List[int]] = None  # toolkit:tito

    @model_validator(mode="before")
    @classmethod
    def set_tool_choice_default(cls, values):
        return values

    # toolkit:tito
    @model_validator(mode="before")
    @classmethod
    def _toolkit_tito_request(cls, data):
        return _toolkit_tito.normalize_request(data)


class ChatCompletionResponse(BaseModel):
    id: str
    created: int = Field(default_factory=lambda: int(time.time()))
    prompt_logprobs: Optional[List[Optional[Dict[str, Any]]]] = None  # toolkit:tito

    @model_serializer(mode="wrap")
    @_toolkit_tito.omit_when_none("prompt_logprobs")  # toolkit:tito
    def _serialize(self, handler):
        return handler(self)
'''


def test_protocol_gets_the_request_fields_validator_logprob_ids_and_prompt_logprobs():
    assert patched(PROTOCOL, PROTOCOL_BEFORE) == PROTOCOL_AFTER


def test_protocol_keeps_the_input_ids_field_0_5_23_already_has():
    before = PROTOCOL_BEFORE.replace("    stream: bool = False\n", "    stream: bool = False\n"
                                     "    input_ids: Optional[List[int]] = None\n", 1)
    after = PROTOCOL_AFTER.replace("    input_ids: Optional[List[int]] = None  # toolkit:tito\n",
                                   "    input_ids: Optional[List[int]] = None\n")
    assert patched(PROTOCOL, before, "0.5.23") == after


@pytest.mark.parametrize("cls,anchor", [
    ("TopLogprob", "TopLogprob"), ("ChatCompletionTokenLogprob", "ChatCompletionTokenLogprob"),
    ("ChatCompletionRequest", "ChatCompletionRequest"),
])
def test_protocol_missing_class_names_its_anchor_file_and_version(cls, anchor):
    before = PROTOCOL_BEFORE.replace(f"class {cls}(", f"class Renamed{cls}(")
    with pytest.raises(AnchorError, match=rf"anchor {anchor} .* not found") as error:
        patched(PROTOCOL, before, "0.5.23")
    assert error.value.relpath == "srt/entrypoints/openai/protocol.py"
    assert error.value.engine_version == "0.5.23"


def test_protocol_without_the_response_serializer_names_the_anchor():
    before = PROTOCOL_BEFORE.replace('    @model_serializer(mode="wrap")\n', "")
    with pytest.raises(AnchorError, match=r"ChatCompletionResponse\.serializer .* not found"):
        patched(PROTOCOL, before)


# --------------------------------------------------------------------------------------------------
# serving_chat.py

SERVING_BEFORE_0_5_9 = '''
import time
from sglang.srt.entrypoints.openai.protocol import MessageProcessingResult


class OpenAIServingChat(OpenAIServingBase):
    def _validate_request(self, request):
        """Validate that the input is valid."""
        if not request.messages:
            return "Messages cannot be empty."
        return None

    def _convert_to_internal_request(self, request, raw_request=None):
        processed = self._process_messages(request, False)
        return GenerateReqInput(input_ids=processed.prompt_ids, logprob_start_len=-1), request

    def _process_messages(self, request, is_multimodal):
        # Use chat template
        if self.template_manager.chat_template_name is None:
            result = self._apply_jinja_template(request, None, is_multimodal)
        else:
            result = self._apply_conversation_template(request, is_multimodal)
        return result

    def _build_chat_response(self, request, ret, created):
        return ChatCompletionResponse(id="x")

    def _process_response_logprobs(self, ret_item):
        return ChoiceLogprobs(content=[])

    def _process_streaming_logprobs(self, content, n_prev_token):
        return ChoiceLogprobs(content=[])
'''

SERVING_AFTER_0_5_9 = '''
import time
from toolkit.patches.sglang.tito import runtime as _toolkit_tito  # toolkit:tito
from sglang.srt.entrypoints.openai.protocol import MessageProcessingResult


class OpenAIServingChat(OpenAIServingBase):
    def _validate_request(self, request):
        """Validate that the input is valid."""
        if not request.messages and not _toolkit_tito.has_input_ids(request):  # toolkit:tito
            return "Messages cannot be empty."
        return None

    @_toolkit_tito.convert_request  # toolkit:tito
    def _convert_to_internal_request(self, request, raw_request=None):
        processed = self._process_messages(request, False)
        return GenerateReqInput(input_ids=processed.prompt_ids, logprob_start_len=-1), request

    def _process_messages(self, request, is_multimodal):
        # Use chat template
        if _toolkit_tito.has_input_ids(request):  # toolkit:tito
            result = _toolkit_tito.processed_input_ids(request, MessageProcessingResult)
        elif self.template_manager.chat_template_name is None:
            result = self._apply_jinja_template(request, None, is_multimodal)
        else:
            result = self._apply_conversation_template(request, is_multimodal)
        return result

    @_toolkit_tito.finish_chat_response  # toolkit:tito
    def _build_chat_response(self, request, ret, created):
        return ChatCompletionResponse(id="x")

    @_toolkit_tito.response_logprob_ids  # toolkit:tito
    def _process_response_logprobs(self, ret_item):
        return ChoiceLogprobs(content=[])

    @_toolkit_tito.stream_logprob_ids  # toolkit:tito
    def _process_streaming_logprobs(self, content, n_prev_token):
        return ChoiceLogprobs(content=[])
'''

SERVING_BEFORE_0_5_23 = '''
import time


class OpenAIServingChat(OpenAIServingBase):
    def _validate_request(self, request):
        if not request.messages:
            return "Messages cannot be empty."
        return None

    def _convert_to_internal_request(self, request, raw_request=None):
        processed = self._process_messages(request, False)
        return GenerateReqInput(input_ids=processed.prompt_ids, logprob_start_len=-1), request

    def _process_messages(self, request, is_multimodal):
        if request.input_ids is not None:
            result = MessageProcessingResult(prompt_ids=request.input_ids, stop=request.stop or [])
        elif self.template_manager.chat_template_name is None:
            result = self._apply_jinja_template(request, None, is_multimodal)
        return result

    def _build_chat_response(self, request, ret, created):
        return ChatCompletionResponse(id="x")

    def _build_token_logprobs_from_raw(self, output_token_logprobs, output_top_logprobs):
        return []
'''

SERVING_AFTER_0_5_23 = '''
import time
from toolkit.patches.sglang.tito import runtime as _toolkit_tito  # toolkit:tito


class OpenAIServingChat(OpenAIServingBase):
    def _validate_request(self, request):
        if not request.messages and not _toolkit_tito.has_input_ids(request):  # toolkit:tito
            return "Messages cannot be empty."
        return None

    @_toolkit_tito.convert_request  # toolkit:tito
    def _convert_to_internal_request(self, request, raw_request=None):
        processed = self._process_messages(request, False)
        return GenerateReqInput(input_ids=processed.prompt_ids, logprob_start_len=-1), request

    def _process_messages(self, request, is_multimodal):
        if request.input_ids is not None:
            result = MessageProcessingResult(prompt_ids=request.input_ids, stop=request.stop or [])
        elif self.template_manager.chat_template_name is None:
            result = self._apply_jinja_template(request, None, is_multimodal)
        return result

    @_toolkit_tito.finish_chat_response  # toolkit:tito
    def _build_chat_response(self, request, ret, created):
        return ChatCompletionResponse(id="x")

    @_toolkit_tito.logprob_ids_from_raw  # toolkit:tito
    def _build_token_logprobs_from_raw(self, output_token_logprobs, output_top_logprobs):
        return []
'''


def test_serving_chat_0_5_9_skips_the_template_for_input_ids_and_decorates_the_methods():
    assert patched(SERVING_CHAT, SERVING_BEFORE_0_5_9, "0.5.9") == SERVING_AFTER_0_5_9


def test_serving_chat_0_5_23_relies_on_its_own_input_ids_branch_and_decorates_the_methods():
    assert patched(SERVING_CHAT, SERVING_BEFORE_0_5_23, "0.5.23") == SERVING_AFTER_0_5_23


@pytest.mark.parametrize("version,before,change,anchor", [
    ("0.5.9", SERVING_BEFORE_0_5_9, ("if not request.messages:", "if request.messages is None:"), "messages-required"),
    ("0.5.9", SERVING_BEFORE_0_5_9, ("chat_template_name is None", "chat_template is None"), "template-branch"),
    ("0.5.9", SERVING_BEFORE_0_5_9, ("_convert_to_internal_request(self, request,", "_convert_to_internal_request(self, req,"),
     "_convert_to_internal_request"),
    ("0.5.9", SERVING_BEFORE_0_5_9, ("def _process_streaming_logprobs", "def _stream_logprobs"),
     "_process_streaming_logprobs"),
    ("0.5.23", SERVING_BEFORE_0_5_23, ("_build_chat_response(self, request, ret,", "_build_chat_response(self, request, outputs,"),
     "_build_chat_response"),
    ("0.5.23", SERVING_BEFORE_0_5_23, ("_build_token_logprobs_from_raw(self, output_token_logprobs,",
                                       "_build_token_logprobs_from_raw(self, token_logprobs,"),
     "_build_token_logprobs_from_raw"),
    # without the raw builder, its two callers are what must be there
    ("0.5.23", SERVING_BEFORE_0_5_23, ("def _build_token_logprobs_from_raw", "def _logprobs_from_raw"),
     "_process_response_logprobs"),
])
def test_serving_chat_missing_structure_names_its_anchor(version, before, change, anchor):
    changed = before.replace(*change)
    assert changed != before
    with pytest.raises(AnchorError, match=rf"anchor {anchor} .* not found") as error:
        patched(SERVING_CHAT, changed, version)
    assert error.value.engine_version == version


# 0.5.13-0.5.20: their own input_ids branch, but logprob entries built by the two callers
SERVING_BEFORE_0_5_13 = SERVING_BEFORE_0_5_23.replace(
    SERVING_BEFORE_0_5_23[SERVING_BEFORE_0_5_23.index("    def _build_token_logprobs_from_raw"):],
    SERVING_BEFORE_0_5_9[SERVING_BEFORE_0_5_9.index("    def _process_response_logprobs"):])


def test_serving_chat_paths_are_chosen_by_the_code_not_the_version():
    """The 0.5.13-0.5.20 shape, whatever version it is given: upstream's input_ids branch is relied on
    and the two logprob callers are decorated; without upstream's branch, ours goes in."""
    for version in ("0.5.9", "0.5.15", "0.5.23"):
        after = patched(SERVING_CHAT, SERVING_BEFORE_0_5_13, version)
        assert "has_input_ids(request):  # toolkit:tito\n            result" not in after
        assert "if request.input_ids is not None:\n" in after
        assert "@_toolkit_tito.response_logprob_ids" in after and "@_toolkit_tito.stream_logprob_ids" in after
    assert patched(SERVING_CHAT, SERVING_BEFORE_0_5_9, "0.5.23") == SERVING_AFTER_0_5_9
    without_branch = SERVING_BEFORE_0_5_23.replace("if request.input_ids is not None:",
                                                   "if request.prompt_ids is not None:")
    after = patched(SERVING_CHAT, without_branch, "0.5.23")
    assert "        elif _toolkit_tito.has_input_ids(request):  # toolkit:tito\n" in after
    assert "@_toolkit_tito.logprob_ids_from_raw" in after


def test_only_openai_serving_chat_is_edited():
    other = SERVING_BEFORE_0_5_9.replace("class OpenAIServingChat(", "class OpenAIServingOther(")
    with pytest.raises(AnchorError, match=r"anchor messages-required .* not found"):
        patched(SERVING_CHAT, other)


# --------------------------------------------------------------------------------------------------
# the real sources of every supported version


def source_tree(version: str) -> Path:
    return ensure_source_tree("sglang", version)


HTTP_BEFORE = '''
app = FastAPI()


@app.post("/v1/chat/completions", dependencies=[Depends(validate_json_request)])
async def openai_v1_chat_completions(request: ChatCompletionRequest, raw_request: Request):
    return await raw_request.app.state.openai_serving_chat.handle_request(request, raw_request)


@app.post("/v1/embeddings")
async def openai_v1_embeddings(request, raw_request):
    return None
'''
HTTP_AFTER = HTTP_BEFORE.replace(
    '@app.post("/v1/chat/completions", ',
    '@app.post("/v1/chat/completions/tokens", dependencies=[Depends(validate_json_request)], include_in_schema=False)'
    '  # toolkit:tito\n@app.post("/v1/chat/completions", ')


def test_http_server_answers_the_tokens_route_with_the_chat_handler():
    assert patched(HTTP_SERVER, HTTP_BEFORE) == HTTP_AFTER
    with pytest.raises(AnchorError, match="chat-route"):
        patched(HTTP_SERVER, HTTP_BEFORE.replace('"/v1/chat/completions"', '"/v1/chat"'))


def real(version: str, relpath: str) -> str:
    return (source_tree(version) / "sglang" / relpath).read_text()


# import, request fields (+ input_ids on 0.5.9), validator, two token_id fields, prompt_logprobs field
# and serializer decorator / import, messages check, four (0.5.9) or three decorators, template branch (0.5.9)
MARKED_EDITS = {
    (PROTOCOL.relpath, "0.5.9"): 9,
    (PROTOCOL.relpath, "0.5.23"): 8,
    (SERVING_CHAT.relpath, "0.5.9"): 7,
    (SERVING_CHAT.relpath, "0.5.23"): 5,
    (HTTP_SERVER.relpath, "0.5.9"): 1,  # the tokens route
    (HTTP_SERVER.relpath, "0.5.23"): 1,
}


@pytest.mark.parametrize("version", VERSIONS)
def test_real_sources_find_every_anchor_once_and_compile(version):
    assert PATCH.supports(version)
    for edit in PATCH.files:
        source = real(version, edit.relpath)
        result = transform_or_raise(PATCH, edit, source, version)  # raises on any anchor; compiles
        assert result.anchors and all(anchor.count == 1 for _, anchor in result.anchors), result.anchors
        added = set(result.after.splitlines()) - set(source.splitlines())
        assert added and all("# toolkit:tito" in line or "_toolkit_tito." in line or line.strip().startswith(
            ("@model_validator", "@classmethod", "def _toolkit_tito_request", "elif ")) for line in added), added
        assert result.after.count("# toolkit:tito") == MARKED_EDITS[edit.relpath, version]
        compile(result.after, edit.relpath, "exec")


# The names the injected code uses, per function: compile() does not catch an unbound name.
INJECTED_NAMES = {"_validate_request": {"request"}, "_process_messages": {"request"}}


@pytest.mark.parametrize("version", VERSIONS)
def test_real_sources_injected_code_uses_bound_names(version):
    after = transform_or_raise(PATCH, SERVING_CHAT, real(version, SERVING_CHAT.relpath), version).after
    module = ast.parse(after)
    imported = {alias.asname or alias.name for node in ast.walk(module) if isinstance(node, ast.ImportFrom)
                for alias in node.names}
    assert "MessageProcessingResult" in imported
    (chat,) = [n for n in module.body if isinstance(n, ast.ClassDef) and n.name == "OpenAIServingChat"]
    for method in chat.body:
        if isinstance(method, ast.FunctionDef) and method.name in INJECTED_NAMES:
            params = {a.arg for a in method.args.args}
            assert INJECTED_NAMES[method.name] <= params


@pytest.mark.parametrize("version", VERSIONS)
def test_token_ids_and_tito_compose_in_either_order(version):
    for tito_edit, ids_edit in zip(PATCH.files, TOKEN_IDS.files):
        assert tito_edit.relpath == ids_edit.relpath
        source = real(version, tito_edit.relpath)
        first = transform_or_raise(TOKEN_IDS, ids_edit, transform_or_raise(PATCH, tito_edit, source, version).after,
                                   version).after
        second = transform_or_raise(PATCH, tito_edit, transform_or_raise(TOKEN_IDS, ids_edit, source, version).after,
                                    version).after
        for after in (first, second):
            compile(after, tito_edit.relpath, "exec")
            assert after.count("# toolkit:tito") == MARKED_EDITS[tito_edit.relpath, version]
            assert "# toolkit:token-ids" in after
        # the same lines, whichever went first (only their order may differ)
        assert sorted(first.splitlines()) == sorted(second.splitlines())


def _copy(version: str, tmp_path: Path) -> Path:
    """A writable site dir with the dist-info and only the files the patches edit."""
    tree = source_tree(version)
    site = tmp_path / "site"
    for entry in tree.iterdir():
        if entry.name.endswith(".dist-info"):
            shutil.copytree(entry, site / entry.name)
    for edit in PATCH.files:
        target = site / "sglang" / edit.relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(tree / "sglang" / edit.relpath, target)
    return site


def _digests(site: Path) -> dict[str, str]:
    return {e.relpath: hashlib.sha256((site / "sglang" / e.relpath).read_bytes()).hexdigest() for e in PATCH.files}


@pytest.mark.parametrize("version", VERSIONS)
def test_apply_then_revert_is_byte_identical_on_real_sources_alone_and_with_token_ids(version, tmp_path):
    site = _copy(version, tmp_path)
    installed = load_source(site).as_installed()
    original = _digests(site)

    def states() -> dict[str, str]:
        return {row.patch_id: row.state for row in engine.status(installed) if row.patch_id in ("token-ids", "tito")}

    by_id.apply(installed, ["tito"])
    alone = _digests(site)
    assert states() == {"token-ids": "not applied", "tito": "applied"}
    assert all(alone[f] != original[f] for f in original)
    assert by_id.apply(installed, ["tito"]).changed == []  # applying again changes nothing
    by_id.apply(installed, ["token-ids"])
    assert states() == {"token-ids": "applied", "tito": "applied"}
    by_id.revert(installed, ["token-ids"])  # tito stays, exactly as applied alone
    assert _digests(site) == alone and states()["tito"] == "applied"
    by_id.apply(installed, ["token-ids"])
    by_id.revert(installed, ["tito"])  # token-ids stays, exactly as applied alone
    assert states() == {"token-ids": "applied", "tito": "not applied"}
    assert "# toolkit:tito" not in (site / "sglang" / SERVING_CHAT.relpath).read_text()
    by_id.revert(installed, ["token-ids"])
    assert _digests(site) == original
    assert states() == {"token-ids": "not applied", "tito": "not applied"}
