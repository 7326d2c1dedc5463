"""The patch-sweep edits: three one-line hooks into vLLM; everything they call is in the runtime.

entrypoints/launchers/app.py: ``build_app`` calls ``attach_routes(app)`` right after vLLM registers its
own routers (it adds the routes only when patching is enabled).

entrypoints/launchers/api_server/entry.py: ``build_async_engine_client_from_engine_args`` calls
``force_eager(engine_args)`` before the engine config is built (forward hooks need eager mode; it logs
when it turns eager mode on).

entrypoints/openai/api_server.py, on releases before vLLM split it into ``entrypoints/launchers/``
(0.24-0.28): both functions live here, and ``build_app`` registers vLLM's routers inline, with no
``register_api_routers``. Our routes go after the last of them: before the endpoint plugins where
``build_app`` attaches any (their order on newer releases), else before ``app.root_path = ...``.

v1/worker/worker_base.py: ``WorkerWrapperBase.__getattr__`` first asks the runtime for one of our
worker methods, so ``collective_rpc("toolkit_patch_sweep_<op>")`` reaches them by name in every
executor (uniproc, multiprocessing and Ray all resolve a method name on the wrapper).

v1/core/kv_cache_utils.py: ``generate_block_hash_extra_keys`` adds the runtime's private key to the
hash of every block of a sweep cell that may hold patched KV (prefix reuse: the blocks before the
cell's first patched position keep their ordinary hash and are shared with the sweep's corrupt run;
the others hash uniquely, so no request can ever be served them).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import MODULE, AnchoredTransformer

RUNTIME = "_toolkit_patch_sweep"
PACKAGE = "toolkit.patches.vllm.patch_sweep"

REGISTER_ROUTERS = m.SimpleStatementLine(body=[m.Expr(value=m.Call(func=m.Name("register_api_routers")))])
ENDPOINT_PLUGINS = m.SimpleStatementLine(body=[m.Expr(value=m.Call(
    func=m.Name("_attach_endpoint_plugins") | m.Name("attach_endpoint_plugins")))])
ROOT_PATH = m.SimpleStatementLine(body=[m.Assign(
    targets=[m.AssignTarget(m.Attribute(value=m.Name("app"), attr=m.Name("root_path")))])])
CREATE_ENGINE_CONFIG = m.SimpleStatementLine(
    body=[m.Assign(value=m.Call(func=m.Attribute(value=m.Name("engine_args"), attr=m.Name("create_engine_config"))))]
)
IF_NO_EXTRA_KEYS = m.If(test=m.UnaryOperation(operator=m.Not(), expression=m.Name("extra_keys")))
RETURN_WORKER_ATTR = m.SimpleStatementLine(body=[m.Return(value=m.Call(
    func=m.Name("getattr"), args=[m.Arg(m.Attribute(value=m.Name("self"), attr=m.Name("worker"))), m.Arg()]))])


class AppTransformer(AnchoredTransformer):
    """``build_app``: our routes after vLLM's own."""

    RUNTIME, RUNTIME_ALIAS = PACKAGE, RUNTIME
    INSIDE = {MODULE: frozenset({"build_app"})}
    ANCHORS = {"register-routers": "the `register_api_routers(...)` call in module function build_app"}

    @m.leave(m.FunctionDef(name=m.Name("build_app")))
    def attach_routes(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        return self.around(updated_node, REGISTER_ROUTERS, "register-routers",
                           [self.marked_statement(f"{RUNTIME}.attach_routes(app)")])


class InlineRoutersAppTransformer(AnchoredTransformer):
    """``build_app`` that registers vLLM's routers one by one: our routes after the last router, before the
    endpoint plugins (or, without them, before ``app.root_path = ...``). The runtime import comes with
    :class:`EntryTransformer`, which edits the same file."""

    INSIDE = {MODULE: frozenset({"build_app"})}
    ANCHORS = {"routers-end": "after every router in module function build_app: `_attach_endpoint_plugins(...)`, "
               "or without it `app.root_path = ...`"}

    @m.leave(m.FunctionDef(name=m.Name("build_app")))
    def attach_routes(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        body = updated_node.body.body if isinstance(updated_node.body, cst.IndentedBlock) else ()
        end = ENDPOINT_PLUGINS if any(m.matches(statement, ENDPOINT_PLUGINS) for statement in body) else ROOT_PATH
        return self.around(updated_node, end, "routers-end",
                           [self.marked_statement(f"{RUNTIME}.attach_routes(app)")], before=True)


class EntryTransformer(AnchoredTransformer):
    """``build_async_engine_client_from_engine_args``: eager mode before the engine config exists."""

    RUNTIME, RUNTIME_ALIAS = PACKAGE, RUNTIME
    INSIDE = {MODULE: frozenset({"build_async_engine_client_from_engine_args"})}
    ANCHORS = {
        "create-engine-config": "`vllm_config = engine_args.create_engine_config(...)` in "
        "build_async_engine_client_from_engine_args",
    }

    @m.leave(m.FunctionDef(name=m.Name("build_async_engine_client_from_engine_args")))
    def force_eager(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        return self.around(updated_node, CREATE_ENGINE_CONFIG, "create-engine-config",
                           [self.marked_statement(f"{RUNTIME}.force_eager(engine_args)")], before=True)


class WorkerWrapperTransformer(AnchoredTransformer):
    """``WorkerWrapperBase.__getattr__``: our worker methods by name, before the worker's own."""

    RUNTIME, RUNTIME_ALIAS = PACKAGE, RUNTIME
    INSIDE = {"WorkerWrapperBase": frozenset({"__getattr__"})}
    ANCHORS = {"getattr-return": "`return getattr(self.worker, attr)` in WorkerWrapperBase.__getattr__"}

    @m.leave(m.FunctionDef(name=m.Name("__getattr__")))
    @m.call_if_inside(m.ClassDef(name=m.Name("WorkerWrapperBase")))
    def our_methods_first(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        return self.around(updated_node, RETURN_WORKER_ATTR, "getattr-return", [
            self.marked_statement(f"toolkit_method = {RUNTIME}.worker_method(self, attr)"),
            self.marked_statement("if toolkit_method is not None:\n    return toolkit_method\n"),
        ], before=True)


class BlockHashTransformer(AnchoredTransformer):
    """``generate_block_hash_extra_keys``: a private key on the blocks of a sweep cell that may hold
    patched KV, before the function decides whether there are any extra keys."""

    RUNTIME, RUNTIME_ALIAS = PACKAGE, RUNTIME
    INSIDE = {MODULE: frozenset({"generate_block_hash_extra_keys"})}
    ANCHORS = {"no-extra-keys": "`if not extra_keys:` in module function generate_block_hash_extra_keys"}

    @m.leave(m.FunctionDef(name=m.Name("generate_block_hash_extra_keys")))
    def private_blocks(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        return self.around(updated_node, IF_NO_EXTRA_KEYS, "no-extra-keys", [self.marked_statement(
            f"extra_keys += {RUNTIME}.private_block_keys(request, start_token_idx, end_token_idx)")], before=True)
