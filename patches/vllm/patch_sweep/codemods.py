"""The patch-sweep edits: three one-line hooks into vLLM; everything they call is in the runtime.

entrypoints/launchers/app.py: ``build_app`` calls ``attach_routes(app)`` right after vLLM registers its
own routers (it adds the routes only when patching is enabled).

entrypoints/launchers/api_server/entry.py: ``build_async_engine_client_from_engine_args`` calls
``force_eager(engine_args)`` before the engine config is built (forward hooks need eager mode; it logs
when it turns eager mode on).

v1/worker/worker_base.py: ``WorkerWrapperBase.__getattr__`` first asks the runtime for one of our
worker methods, so ``collective_rpc("toolkit_patch_sweep_<op>")`` reaches them by name in every
executor (uniproc, multiprocessing and Ray all resolve a method name on the wrapper).
"""

from __future__ import annotations

from typing import Sequence

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer

RUNTIME = "_toolkit_patch_sweep"
RUNTIME_IMPORT = f"from toolkit.patches.vllm.patch_sweep import runtime as {RUNTIME}"


class _SweepTransformer(AnchoredTransformer):
    """The runtime import, and one edit at a statement of one function (module level or in a class)."""

    CLASS: str | None = None  # the class holding FUNCTION, or None for a module-level function
    FUNCTION = ""
    STATEMENT: m.BaseMatcherNode = m.DoNotCare()  # the anchor statement inside FUNCTION
    ANCHOR = ""
    BEFORE = False  # insert before the anchor statement (else after it)

    def __init__(self, context) -> None:
        super().__init__(context)
        self._scope: list[str] = []

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        return self.insert_after_first_import(updated_node, RUNTIME_IMPORT, "runtime-import")

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self._scope.append(node.name.value)

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self._scope.pop()
        return updated_node

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scope.append(node.name.value)

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        scope, self._scope = self._scope, self._scope[:-1]
        expected = [self.CLASS, self.FUNCTION] if self.CLASS else [self.FUNCTION]
        if scope != expected or not isinstance(updated_node.body, cst.IndentedBlock):
            return updated_node
        body: list[cst.BaseStatement] = []
        for statement in updated_node.body.body:
            if m.matches(statement, self.STATEMENT):
                self.hit(self.ANCHOR)
                new = self.injected()
                body += [*new, statement] if self.BEFORE else [statement, *new]
            else:
                body.append(statement)
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))

    def injected(self) -> Sequence[cst.BaseStatement]:
        raise NotImplementedError


def _call_statement(callee: m.BaseExpressionMatcher) -> m.SimpleStatementLine:
    return m.SimpleStatementLine(body=[m.Expr(value=m.Call(func=callee))])


class AppTransformer(_SweepTransformer):
    """``build_app``: our routes after vLLM's own."""

    ANCHORS = {
        "runtime-import": "the module's first import (the runtime import goes after it)",
        "register-routers": "the `register_api_routers(...)` call in module function build_app",
    }
    FUNCTION = "build_app"
    STATEMENT = _call_statement(m.Name("register_api_routers"))
    ANCHOR = "register-routers"

    def injected(self) -> Sequence[cst.BaseStatement]:
        return [self.marked_statement(f"{RUNTIME}.attach_routes(app)")]


class EntryTransformer(_SweepTransformer):
    """``build_async_engine_client_from_engine_args``: eager mode before the engine config exists."""

    ANCHORS = {
        "runtime-import": "the module's first import (the runtime import goes after it)",
        "create-engine-config": "`vllm_config = engine_args.create_engine_config(...)` in "
        "build_async_engine_client_from_engine_args",
    }
    FUNCTION = "build_async_engine_client_from_engine_args"
    STATEMENT = m.SimpleStatementLine(
        body=[m.Assign(value=m.Call(func=m.Attribute(value=m.Name("engine_args"), attr=m.Name("create_engine_config"))))]
    )
    ANCHOR = "create-engine-config"
    BEFORE = True

    def injected(self) -> Sequence[cst.BaseStatement]:
        return [self.marked_statement(f"{RUNTIME}.force_eager(engine_args)")]


class WorkerWrapperTransformer(_SweepTransformer):
    """``WorkerWrapperBase.__getattr__``: our worker methods by name, before the worker's own."""

    ANCHORS = {
        "runtime-import": "the module's first import (the runtime import goes after it)",
        "getattr-return": "`return getattr(self.worker, attr)` in WorkerWrapperBase.__getattr__",
    }
    CLASS = "WorkerWrapperBase"
    FUNCTION = "__getattr__"
    STATEMENT = m.SimpleStatementLine(
        body=[m.Return(value=m.Call(func=m.Name("getattr"), args=[m.Arg(m.Attribute(value=m.Name("self"), attr=m.Name("worker"))), m.Arg()]))]
    )
    ANCHOR = "getattr-return"
    BEFORE = True

    def injected(self) -> Sequence[cst.BaseStatement]:
        return [
            self.marked_statement(f"toolkit_method = {RUNTIME}.worker_method(self, attr)"),
            cst.parse_statement(f"if toolkit_method is not None:  {self.marker}\n    return toolkit_method\n"),
        ]
