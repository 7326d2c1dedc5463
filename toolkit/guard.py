"""Guard the runtime imports a patch writes into an engine file, so that a patched engine whose
environment loses this project (``pip uninstall`` without a revert) still starts, as the release.

Every codemod imports its runtime with one module-level line::

    from toolkit.patches.vllm.tito import runtime as _toolkit_tito  # toolkit:tito

After all patches have rewritten a file, :func:`guard_runtime_imports` wraps each such line in a
``try``. When ``toolkit`` cannot be imported there, the ``except`` branch runs the release's own
file (the backup under ``.toolkit-state``, found by a path relative to the patched file) as the module
in its place (``sys.modules``), logs one warning per process naming the command that puts the
release's files back, and binds the runtime name to a stand-in so the rest of the patched file can
finish executing; nothing of it is used. An import error of anything other than ``toolkit`` is
raised as it was. Another distribution's patch imports its own runtime
(``from my_patch import runtime as _my_patch  # toolkit:my-patch``): the same guard, with its
package as the owner whose absence it forgives.
"""

from __future__ import annotations

import os
from pathlib import Path

import libcst as cst
import libcst.matchers as m

from toolkit.version import __version__

HELPER = "_toolkit_release"

# Written once per file, before its first guarded import. Plain stdlib code: it runs inside the
# engine when this project is gone, so it can rely on nothing of it.
_HELPER_TEMPLATE = '''
def {helper}(missing, backup, owner="toolkit"):
    """serving-toolkit (or the patch package ``owner``) patched this file and is not importable now: run
    the release's own file (the backup the patch kept) as this module instead, warn once, and return a
    stand-in for the runtime."""
    import logging, os, sys, types
    if (missing.name or "").partition(".")[0] not in ("toolkit", owner):
        raise missing

    class Unused:  # the runtime's stand-in while the rest of the patched file runs; nothing calls it later
        def __getattr__(self, name): return self
        def __call__(self, *args, **kwargs):  # as a decorator, it leaves the function as it is
            return args[0] if len(args) == 1 and not kwargs and callable(args[0]) else self
        def __getitem__(self, key): return self
        def __iter__(self): return iter(())
        def __or__(self, other): return self
        __ror__ = __or__
        def __mro_entries__(self, bases): return ()

    if getattr(sys.modules.get(__name__), "__toolkit_release__", False):
        return Unused()  # a second guarded import: the release's file runs already
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), backup)
    try:
        with open(path, "rb") as handle:
            code = compile(handle.read(), __file__, "exec", dont_inherit=True)
    except OSError:
        raise ImportError(
            f"{{__name__}} was patched by serving-toolkit, which is not importable here, and the release's copy "
            f"of this file is gone ({{path}}); reinstall {engine}") from None
    module = types.ModuleType(__name__)
    kept = ("__file__", "__spec__", "__loader__", "__package__", "__path__", "__cached__", "__builtins__")
    module.__dict__.update({{key: value for key, value in globals().items() if key in kept}})
    module.__toolkit_release__ = True
    sys.modules[__name__] = module  # before running it, so that circular imports see this module
    if not getattr(sys, "_toolkit_release_warned", False):
        sys._toolkit_release_warned = True
        logging.getLogger("toolkit").warning(
            f"{{'serving-toolkit' if owner == 'toolkit' else owner}} is not importable, but it patched this {engine} install: its patched files run as "
            "the release wrote them (the patches are off). To put the release's files back, run "
            "`pip install serving-toolkit=={version} && toolkit revert {engine}`; or reinstall {engine}.")
    exec(code, module.__dict__)
    return Unused()
'''

_GUARD_TEMPLATE = '''
try:
    {line}
except ModuleNotFoundError as _toolkit_missing:
    {name} = {helper}(_toolkit_missing, {backup!r}{owner})
'''


def backup_relative_to(engine_file: Path, backup: Path) -> str:
    """The backup's path as seen from the patched file's directory (a copied venv keeps it valid)."""
    return os.path.relpath(backup, engine_file.parent)


def _runtime_import(statement: cst.BaseStatement) -> tuple[str, str] | None:
    """(``N``, the importing package's top-level name) when ``statement`` is a patch's runtime import
    alone on its line: ``from toolkit.patches.<...> import runtime as N``, or another distribution's
    ``from <package> import runtime as N  # toolkit:<id>`` (its codemod's RUNTIME, marked)."""
    if not m.matches(statement, m.SimpleStatementLine(body=[m.ImportFrom()])):
        return None
    node = statement.body[0]
    module = cst.helpers.get_full_name_for_node(node.module) if node.module else ""
    if not module or node.relative:
        return None
    comment = statement.trailing_whitespace.comment
    marked = comment is not None and comment.value.startswith("# toolkit:")
    if not (module.startswith("toolkit.patches.") or marked):
        return None
    if isinstance(node.names, cst.ImportStar) or len(node.names) != 1:
        return None
    alias = node.names[0]
    if alias.asname is None or cst.helpers.get_full_name_for_node(alias.name) != "runtime":
        return None
    return cst.helpers.get_full_name_for_node(alias.asname.name), module.partition(".")[0]


def guard_runtime_imports(source: str, engine: str, backup: str) -> str:
    """``source`` with each module-level runtime import guarded (see the module's docstring)."""
    return guard_module(cst.parse_module(source), engine, backup).code


def guard_module(module: cst.Module, engine: str, backup: str) -> cst.Module:
    """:func:`guard_runtime_imports` on a parsed module (the patch engine's last step on a file)."""
    body: list[cst.BaseStatement] = []
    blank = [cst.EmptyLine(), cst.EmptyLine()]
    helper_written = False
    for statement in module.body:
        found = _runtime_import(statement)
        if found is None:
            body.append(statement)
            continue
        name, owner = found
        spacing: list[cst.EmptyLine] = []
        if not helper_written:
            helper = _HELPER_TEMPLATE.format(helper=HELPER, engine=engine, version=__version__)
            body.append(cst.parse_module(helper).body[0].with_changes(leading_lines=blank))
            helper_written, spacing = True, blank
        line = module.code_for_node(statement.with_changes(leading_lines=())).strip()
        # this project's own imports keep the two-argument call (the bytes patched installs already have)
        guard = _GUARD_TEMPLATE.format(line=line, name=name, helper=HELPER, backup=backup,
                                       owner="" if owner == "toolkit" else f", {owner!r}")
        guarded = list(cst.parse_module(guard).body)
        guarded[0] = guarded[0].with_changes(leading_lines=[*spacing, *statement.leading_lines])
        body.extend(guarded)
    return module.with_changes(body=body) if helper_written else module
