"""Guard the runtime imports a patch writes into an engine file, so that a patched engine whose
environment loses this project (``pip uninstall`` without a revert) still starts, as the release.

Every codemod imports its runtime with one module-level line::

    from toolkit.patches.vllm.tito import runtime as _toolkit_tito  # toolkit:tito

After all patches have rewritten a file, :func:`guard_runtime_imports` wraps each such line in a
``try``. When the import fails, the ``except`` branch first looks at what ``toolkit`` the process got:

- a folder of the working directory (``python -m`` and ``python script.py`` put it, or the script's
  folder, first on ``sys.path``; a checkout of this repository has a ``toolkit/`` without ``patches/``)
  that only this import brought in: its modules leave ``sys.modules`` and the runtime is imported from
  the installed package, with ``sys.path`` minus those folders, and one warning names the folder;
- such a folder that code of the process imported before the engine: the patches cannot load (one
  ``toolkit`` per process), and it says so as an error, naming the folder and what to do;
- an installed ``toolkit`` without this runtime (another version): an error too.

Otherwise (``toolkit`` not importable at all: ``pip uninstall`` without a revert) it runs the release's
own file (the backup under ``.toolkit-state``, found by a path relative to the patched file) as the
module in its place (``sys.modules``), logs one warning per process naming the command that puts the
release's files back, and binds the runtime name to a stand-in so the rest of the patched file can
finish executing; nothing of it is used. With ``TOOLKIT_EXPECT_PATCHES`` set (any value: the patches
are expected, docs/scale.md#ray), every case that would run the release raises one ImportError
sentence instead, so the engine refuses to start. An import error of anything other than ``toolkit``
is raised as it was. Another distribution's patch imports its own runtime
(``from my_patch import runtime as _my_patch  # toolkit:my-patch``): the same guard, with its
package as the owner whose absence it forgives.
"""

from __future__ import annotations

import os
from pathlib import Path

import libcst as cst
import libcst.matchers as m

from toolkit.base.version import __version__

HELPER = "_toolkit_release"

# Written once per file, before its first guarded import. Plain stdlib code: it runs inside the
# engine when this project is gone or shadowed, so it can rely on nothing of it. ``_loaded`` (evaluated
# when the ``def`` runs, just before the file's first guarded import; a copy, which another thread's
# import cannot change under it) tells a ``toolkit`` that code of the process imported from the working
# directory before the engine from one that this failed import brought in.
_HELPER_TEMPLATE = '''
def {helper}(missing, backup, package="toolkit", _loaded=frozenset(__import__("sys").modules.copy())):
    """The runtime import of ``package`` (serving-toolkit's, or another patch package's) failed in
    this patched file. When a folder of the working directory shadows the installed package (``python -m``
    puts it first on sys.path), import the runtime from the installed one and return it. Otherwise run
    the release's own file (the backup the patch kept) as this module instead, say why (an error where
    the install has the package but it cannot load), and return a stand-in for the runtime; with
    TOOLKIT_EXPECT_PATCHES set, refuse instead (ImportError)."""
    import logging, os, sys, types
    owner = package.partition(".")[0]
    top = (missing.name or "").partition(".")[0]
    if top not in ("toolkit", owner):
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
    title = "serving-toolkit" if top == "toolkit" else top
    logger = logging.getLogger("toolkit")

    def say(text, loud):  # once per process: every patched file of the engine has this same story
        if getattr(sys, "_toolkit_release_warned", False):
            return
        sys._toolkit_release_warned = True
        if not loud:
            logger.warning(text)
            return
        if logger.hasHandlers():
            logger.error(text)
        print(f"ERROR serving-toolkit: {{text}}", file=sys.stderr, flush=True)

    def drop():  # the modules of ``top`` a failed import left behind
        for key in [key for key in list(sys.modules) if key == top or key.startswith(top + ".")]:
            del sys.modules[key]

    found = sys.modules.get(top)
    # the runtime imported, from a serving-toolkit of another version than the one that patched this file
    stale = missing.msg == "{stale}"
    seen = f"{{title}} {{getattr(found, '__version__', None) or '(version unknown)'}}, not {version} (the one that patched this file)"
    here = {{os.path.realpath(os.curdir)}}  # the working directory ("" on sys.path) and the script's folder
    script = sys.argv[0] if sys.argv and isinstance(sys.argv[0], str) else ""
    if os.path.isfile(script):
        here.add(os.path.dirname(os.path.realpath(script)))
    fix = f"`pip install serving-toolkit=={version} && toolkit revert {engine}`; or reinstall {engine}"
    why, loud = f"{{title}} is not importable", False
    if found is not None:
        homes = [str(place) for place in (getattr(found, "__path__", None) or ())] or [str(getattr(found, "__file__", "") or "?")]
        folder = homes[0]
        of_here = ("a folder" if getattr(found, "__path__", None) is not None else "a file") + " of the working directory"
        if any(os.path.dirname(os.path.realpath(place)) in here for place in homes):
            if top in _loaded:
                why, loud = (f"the {{top!r}} that code of this process imported before {engine} is {{folder}} ({{of_here}}, "
                             f"not {{title}}), so the patches cannot load in this process"), True
                why += f" (it holds {{seen}})" if stale else ""
                fix = f"rename it, or start {engine} from another directory"
            else:
                drop()
                path = list(sys.path)
                sys.path[:] = [entry for entry in path if not (isinstance(entry, str) and os.path.realpath(entry or os.curdir) in here)]
                try:
                    runtime = __import__(package, fromlist=("runtime",)).runtime
                    mine = getattr(sys.modules.get(top), "__version__", None)
                    if top == "toolkit" and mine != "{version}":
                        raise ImportError(f"it is {{title}} {{mine}}, not {version}")
                except (ImportError, AttributeError) as error:
                    drop()
                    if not (isinstance(error, ModuleNotFoundError) and error.name == top):  # installed, cannot load
                        why, loud = (f"{{folder}}, {{of_here}}, shadows {{title}}, and the installed "
                                     f"{{title}} cannot load {{package}}.runtime ({{error}})"), True
                    elif stale:
                        why, loud = f"{{folder}}, {{of_here}}, holds {{seen}}, and no other {{title}} is installed", True
                else:
                    logger.warning(f"{{folder}}, {{of_here}}, shadows {{title}} on sys.path: "
                                   f"the patched {engine} imported its runtime from the installed {{title}} instead "
                                   f"({{os.path.dirname(getattr(sys.modules.get(top), '__file__', None) or '?')}})")
                    return runtime
                finally:
                    sys.path[:] = path + [entry for entry in sys.path if entry not in path]
        else:
            why, loud = f"the {{top!r}} imported here ({{folder}}) " + (f"is {{seen}}" if stale else f"has no {{missing.name}}"), True
            fix = f"run `pip install serving-toolkit=={version}` (the version that patched this file) or `toolkit revert {engine}`"
            try:  # installed as it should be, and shadowed by an entry of sys.path (PYTHONPATH): no pip install
                import importlib.metadata
                shadowed = importlib.metadata.version("serving-toolkit") == "{version}" and top == "toolkit"
            except Exception:
                shadowed = False
            if shadowed:
                fix = (f"take {{os.path.dirname(folder)}} off sys.path (PYTHONPATH) or rename {{folder}}: it comes "
                       f"before the installed serving-toolkit {version}")
    if os.environ.get("TOOLKIT_EXPECT_PATCHES", "").strip():
        raise ImportError(f"{{__name__}} was patched by {{title}}, but {{why}}, and TOOLKIT_EXPECT_PATCHES is set, so "
                          f"{engine} refuses to start without its patches: {{fix}}") from None
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
    if loud:  # the package is there, or was meant to be: the patches were expected
        say(f"{{title}} patched this {engine} install, but {{why}}; its patched files run as the release wrote them "
            f"(the patches are off): {{fix}}", True)
    else:
        say(f"{{why}}, but it patched this {engine} install: its patched files run as the release wrote them (the "
            f"patches are off). To put the release's files back, run {{fix}}.", False)
    exec(code, module.__dict__)
    return Unused()
'''

_GUARD_TEMPLATE = '''
try:
    {line}{check}
except ModuleNotFoundError as _toolkit_missing:
    {name} = {helper}(_toolkit_missing, {backup!r}, {package!r})
'''


# After the runtime's import: a serving-toolkit of another version (an older unpacked one in the working
# directory, one upgraded without a new apply-patch) is refused as a missing one is.
STALE = "another serving-toolkit version"
_VERSION_CHECK = '''
    if getattr(__import__("toolkit"), "__version__", None) != {version!r}:
        raise ModuleNotFoundError({stale!r}, name="toolkit")'''


def backup_relative_to(engine_file: Path, backup: Path) -> str:
    """The backup's path as seen from the patched file's directory (a copied venv keeps it valid)."""
    return os.path.relpath(backup, engine_file.parent)


def _runtime_import(statement: cst.BaseStatement) -> tuple[str, str] | None:
    """(``N``, the package it imports ``runtime`` from) when ``statement`` is a patch's runtime import
    alone on its line: ``from toolkit.patches.<...> import runtime as N``, or another distribution's
    ``from <package> import runtime as N  # toolkit:<id>`` (its codemod's RUNTIME, marked)."""
    if not m.matches(statement, m.SimpleStatementLine(body=[m.ImportFrom()])):
        return None
    assert isinstance(statement, cst.SimpleStatementLine)  # matched above
    node = statement.body[0]
    assert isinstance(node, cst.ImportFrom)  # matched above
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
    name = cst.helpers.get_full_name_for_node(alias.asname.name)
    assert name is not None  # an import's `as` target is always a plain Name
    return name, module


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
        name, package = found
        spacing: list[cst.EmptyLine] = []
        if not helper_written:
            helper = _HELPER_TEMPLATE.format(helper=HELPER, engine=engine, version=__version__, stale=STALE)
            body.append(cst.parse_module(helper).body[0].with_changes(leading_lines=blank))
            helper_written, spacing = True, blank
        line = module.code_for_node(statement.with_changes(leading_lines=())).strip()
        check = _VERSION_CHECK.format(version=__version__, stale=STALE) if package.startswith("toolkit.") else ""
        guard = _GUARD_TEMPLATE.format(line=line, check=check, name=name, helper=HELPER, backup=backup, package=package)
        guarded = list(cst.parse_module(guard).body)
        guarded[0] = guarded[0].with_changes(leading_lines=[*spacing, *statement.leading_lines])
        body.extend(guarded)
    return module.with_changes(body=body) if helper_written else module
