"""The edit, on ``sglang/srt/entrypoints/engine.py``.

``_set_envs_and_config`` (run by ``Engine.__init__`` and ``launch_server``) registers a SIGQUIT
handler with ``signal.signal``, which Python allows only on the main thread: an engine started from
any other thread (a Ray async actor, verl's case) fails with ``ValueError: signal only works in main
thread of the main interpreter``. The statement of the function that registers the handler (in 0.5.9
an ``if``/``else`` on ``server_args.custom_sigquit_handler``) is wrapped, as SGLang 0.5.10 does
itself::

    if threading.current_thread() is threading.main_thread():  # toolkit:sigquit-main-thread
        if server_args.custom_sigquit_handler is None:
            ...
            signal.signal(signal.SIGQUIT, launch_phase_sigquit_handler)
        else:
            ...
    else:
        logger.warning("...")

Everything else of the function is the release's own. The function's statement that calls
``signal.signal`` outside a main-thread check must be exactly one (an anchor); the module must import
``threading`` (a second anchor: 0.5.9 does, and the edit does not add imports the release does not
have). The two shapes SGLang has are told apart by structure: where the handler is already registered
under ``if threading.current_thread() is threading.main_thread():`` (0.5.10 on, the upstream fix) no
statement counts, so the anchor is not found and nothing is written, never a guard inside a guard;
the declaration says why (``not_needed``).
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import MODULE, AnchoredTransformer

FUNCTION = "_set_envs_and_config"
REGISTERS = m.Call(func=m.Attribute(value=m.Name("signal"), attr=m.Name("signal")))
# `threading.current_thread() is threading.main_thread()`: SGLang 0.5.10's own guard, and ours
ON_MAIN_THREAD = m.Comparison(
    left=m.Call(func=m.Attribute(value=m.Name("threading"), attr=m.Name("current_thread"))),
    comparisons=[m.ComparisonTarget(operator=m.Is(), comparator=m.Call(
        func=m.Attribute(value=m.Name("threading"), attr=m.Name("main_thread"))))])

GUARD = '''\
if threading.current_thread() is threading.main_thread():
    pass
else:
    logger.warning(
        "SIGQUIT handler not registered: the engine is not launched from the main thread, so a "
        "failing child process will not take down the process tree"
    )
'''


class EngineTransformer(AnchoredTransformer):
    INSIDE = {MODULE: frozenset({FUNCTION})}
    ANCHORS = {
        "import-threading": "a module-level `import threading`",
        "sigquit": f"the one statement of {FUNCTION}() that calls signal.signal(...) outside a main-thread check",
    }

    @m.visit(m.SimpleStatementLine(body=[m.Import(names=[m.ImportAlias(name=m.Name("threading"), asname=None)])]))
    def imports_threading(self, node: cst.SimpleStatementLine) -> None:
        self.hit("import-threading")

    @m.leave(m.FunctionDef(name=m.Name(FUNCTION)))
    def guard_the_handler(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        body = list(updated_node.body.body)
        # a statement that already is the main-thread check (SGLang 0.5.10 on) is the fixed shape: it is
        # not counted, so such a release fails on this anchor instead of getting a second, nested guard
        registering = [i for i, statement in enumerate(body)
                       if m.findall(statement, REGISTERS) and not m.matches(statement, m.If(test=ON_MAIN_THREAD))]
        if len(registering) != 1:
            return updated_node  # none, or several: the anchor report names it and nothing is written
        self.hit("sigquit")
        (at,) = registering
        statement = body[at]
        guard = self.marked_statement(GUARD)
        body[at] = guard.with_changes(
            leading_lines=statement.leading_lines,  # the blank line and comments above stay above
            body=guard.body.with_changes(body=[statement.with_changes(leading_lines=[])]))
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))
