"""``toolkit new-patch NAME --engine vllm|sglang``: a patch package of one's own, ready to grow.

The skeleton is a whole distribution (``my-fix`` -> ``toolkit-patch-my-fix``, import package
``toolkit_patch_my_fix``) that registers its patch in the ``toolkit.patches`` entry-point group and
passes its own tests as written: a golden test of its one codemod and the conformance run over every
release of the engine it declares (the cached source trees, nothing downloaded). The edit is a harmless
call of ``runtime.on_request(request)`` in a method that exists in every such release and that none of
this project's own patches edits, so it composes with them as it is. The templates live here as
strings: no package data to ship.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from string import Template

from toolkit.base import engines
from toolkit.engine import interrupts
from toolkit.errors import UsageError
from toolkit.base.version import __version__

NAME_PATTERN = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
MAX_NAME = 48


@dataclass(frozen=True)
class EngineTarget:
    """Where an engine's skeleton edits: a method present in every release of ``versions``."""

    engine: str
    versions: str  # the engine's whole proven range
    relpath: str
    cls: str
    method: str
    params: str  # the method's parameters, for the golden snippet
    docstring: str
    body: str  # the rest of the golden snippet's method body (one line)
    called_for: str  # what the runtime hook is called with
    request_type: str
    golden_version: str


    @property
    def title(self) -> str:
        return engines.ENGINES[self.engine].title


# One row per engine: engine, versions, relpath, class, method, its parameters, its docstring, the rest of its
# body, what the hook is called for, the request's type, the release of the golden snippet.
TARGETS = {target.engine: target for target in (
    EngineTarget("vllm", ">=0.24.0,<=0.33.0", "entrypoints/openai/chat_completion/serving.py", "OpenAIServingChat",
                 "create_chat_completion", "self, request, raw_request=None",
                 "Chat Completion API similar to OpenAI's API.",
                 "return await self._create_chat_completion(request, raw_request)",
                 "each chat completion request", "vllm's ChatCompletionRequest", "0.33.0"),
    EngineTarget("sglang", ">=0.5.9,<=0.5.23", "srt/entrypoints/openai/serving_chat.py", "OpenAIServingChat",
                 "_handle_streaming_request", "self, adapted_request, request, raw_request",
                 "Handle streaming chat completion request",
                 "return StreamingResponse(self._generate_chat_stream(adapted_request, request, raw_request))",
                 "each streamed chat completion request", "sglang's ChatCompletionRequest", "0.5.23"),
)}

# ---- the templates ($names are filled in by new_patch; nothing else in them starts with $)

PYPROJECT = """\
[build-system]
requires = ["setuptools>=77"]
build-backend = "setuptools.build_meta"

[project]
name = "$distribution"
version = "0.1.0"
description = "$title patch $name for serving-toolkit"
readme = "README.md"
requires-python = ">=3.10"
dependencies = ["serving-toolkit>=$toolkit_version"]

[project.optional-dependencies]
test = ["pytest>=8"]

# How toolkit finds the patch: `toolkit list` shows it once this package is installed.
[project.entry-points."toolkit.patches"]
$name = "$package.patch:PATCH"

[tool.setuptools]
packages = ["$package"]

[tool.pytest.ini_options]
testpaths = ["tests"]
"""

README = """\
# $distribution

A [serving-toolkit](https://github.com/serving-toolkit/serving-toolkit) patch for $title
(`$versions`), made by `toolkit new-patch $name --engine $engine`.

    pip install -e '.[test]'      # registers the patch (`toolkit list` shows $name) and installs pytest
    python -m pytest              # golden test + conformance on every release it declares
    toolkit apply-patch $engine --patch $name
    toolkit revert $engine --patch $name

| file | holds |
|---|---|
| `$package/patch.py` | `PATCH`: id, engine, versions proved, files edited and their codemods |
| `$package/codemods.py` | one libcst transformer per file, matching by structure; edits carry `# toolkit:$name` |
| `$package/runtime.py` | what the patched engine calls (`on_request`), in every engine process |
| `tests/test_golden.py` | the codemod on a before/after snippet |
| `tests/test_conformance.py` | the patch on every release's real files, alone and with the other registered patches |

As generated, the patch hands $called_for to `runtime.on_request`,
which does nothing: put your code there, and change `codemods.py` (and its golden test) where the
engine must be edited elsewhere.
Keep `runtime.py` free of libcst and of toolkit's patch engine: it loads inside the engine's server.
Widen `versions` in `patch.py` only to releases the conformance test has proved.
"""

INIT = '''\
"""$title patch ``$name`` for serving-toolkit: ``patch.py`` declares it, ``codemods.py`` edits the engine,
``runtime.py`` is what the patched engine calls. Nothing is imported here: the engine imports the
runtime, and it must not load libcst with it."""
'''

PATCH = '''\
"""The ``$name`` patch declaration: what it rewrites, on which $title releases."""

from toolkit.declare import FileEdit, Patch

# Transformers by name: the codemods (libcst) load only when a file is rewritten.
CODEMODS = "$package.codemods"

PATCH = Patch(
    id="$name",
    engine="$engine",
    # The releases tests/test_conformance.py proves it on; widen it only with that test passing.
    versions="$versions",
    files=(FileEdit("$relpath", (f"{CODEMODS}:ServingChatTransformer",)),),
    summary="calls runtime.on_request with $called_for",
    runtime_modules=("$package.runtime",),
)
'''

CODEMODS = '''\
"""The ``$name`` edits, one libcst transformer per engine file, each matching the engine's code by
structure (never by line numbers) and recording the anchors it found: a release without them is refused
with the anchor named, before anything is written.

$relpath:
``$cls.$method`` calls ``runtime.on_request(request)`` first.
"""

from __future__ import annotations

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer, has_params, in_method, with_body

CLASS = "$cls"
METHOD = "$method"
DOCSTRING = m.SimpleStatementLine(body=[m.Expr(value=m.SimpleString() | m.ConcatenatedString())])


class ServingChatTransformer(AnchoredTransformer):
    """``$cls.$method`` calls ``runtime.on_request(request)`` first."""

    # The runtime comes in after the file's first import, as
    # `from $package import runtime as $alias`.
    RUNTIME, RUNTIME_ALIAS = "$package", "$alias"
    INSIDE = {CLASS: frozenset({METHOD})}  # libcst visits nothing else: an apply stays fast
    ANCHORS = {METHOD: f"{CLASS}.{METHOD}($params)"}

    @m.leave(m.FunctionDef(name=m.Name(METHOD)))
    @in_method(CLASS, METHOD)
    def call_the_runtime(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if not has_params(updated_node, "self", "request"):
            return updated_node  # not the method this edit knows: its anchor then says "not found"
        self.hit(METHOD)
        call = self.marked_statement(f"{self.RUNTIME_ALIAS}.on_request(request)")
        body = list(updated_node.body.body)
        start = 1 if body and m.matches(body[0], DOCSTRING) else 0  # after the docstring
        return with_body(updated_node, [*body[:start], call, *body[start:]])
'''

RUNTIME = '''\
"""What the patched $title calls, in every engine process. Import only the engine and the standard
library here, never libcst or toolkit's patch engine: this module loads inside the engine's server."""

from __future__ import annotations

from typing import Any


def on_request(request: Any) -> None:
    """Called with $called_for ($request_type),
    before the engine serves it."""
    # Your code goes here: read or adjust `request`. Returning None lets the engine go on
    # as the release does.
    return None
'''

GOLDEN = '''\
"""The codemod on a snippet with the structure it anchors on; tests/test_conformance.py runs it on the
real files of every release the patch declares."""

import pytest

from toolkit.testing import assert_codemod
from $package.codemods import ServingChatTransformer
from $package.patch import PATCH

BEFORE = \'\'\'
from fastapi import Request


class $cls(Base):
    async def $method($params):
        """$docstring"""
        $body
\'\'\'

AFTER = \'\'\'
from fastapi import Request
from $package import runtime as $alias  # toolkit:$name


class $cls(Base):
    async def $method($params):
        """$docstring"""
        $alias.on_request(request)  # toolkit:$name
        $body
\'\'\'


def edit(before, after):
    assert_codemod(ServingChatTransformer, before, after, engine=PATCH.engine, engine_version="$golden_version",
                   relpath=PATCH.files[0].relpath, patch_id=PATCH.id)


def test_the_request_goes_to_the_runtime_first():
    edit(BEFORE, AFTER)


def test_a_release_without_the_method_is_refused():
    renamed = BEFORE.replace("def $method(", "def renamed(")
    with pytest.raises(AssertionError):
        edit(renamed, renamed)
'''

CONFORMANCE = '''\
"""The patch on the real files of every $title release it declares (cached source trees): anchors, apply,
compile, marker, idempotent apply, status, byte-identical revert, and composition with every other
registered $title patch, before and after it."""

from toolkit.testing import assert_conforms
from $package.patch import PATCH


def test_conforms_on_every_release_it_declares():
    assert_conforms(PATCH)
'''

FILES = {  # path in the package folder ("PKG" is the import package) -> template
    "pyproject.toml": PYPROJECT,
    "README.md": README,
    "PKG/__init__.py": INIT,
    "PKG/patch.py": PATCH,
    "PKG/codemods.py": CODEMODS,
    "PKG/runtime.py": RUNTIME,
    "tests/test_golden.py": GOLDEN,
    "tests/test_conformance.py": CONFORMANCE,
}


def distribution_of(name: str) -> str:
    return f"toolkit-patch-{name}"


def package_of(name: str) -> str:
    return "toolkit_patch_" + name.replace("-", "_")


def check_name(name: str, engine: str) -> None:
    """Refuse a name that cannot be a patch id and a package name, or that a registered patch of the
    engine already has (two entry points with one id break every toolkit command)."""
    if engine not in TARGETS:
        engines.check_engine(engine)
    if not NAME_PATTERN.fullmatch(name) or len(name) > MAX_NAME:
        raise UsageError(f"patch name {name!r} is not lowercase words joined by hyphens, starting with a letter "
                         f"and at most {MAX_NAME} characters (such as my-fix)")
    from toolkit.patch_registry import registry

    if any(patch.engine == engine and patch.id == name for patch in registry()):
        raise UsageError(f"{TARGETS[engine].title} already has a registered patch named {name}: choose another name")


def new_patch(name: str, engine: str, directory: Path | str | None = None) -> Path:
    """Write the skeleton of patch ``name`` for ``engine`` into ``directory`` (default:
    ``./toolkit-patch-<name>``; it may exist if empty) and return the folder."""
    check_name(name, engine)
    try:
        folder = Path(directory if directory is not None else distribution_of(name)).expanduser().resolve()
    except RuntimeError:  # "~someone/x" with no such user, or no home at all
        raise UsageError(f"{directory}: no such user's home folder on this machine; choose another --dir") from None
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{folder} is a file, not a folder: choose another --dir")
    if folder.is_dir() and any(folder.iterdir()):
        raise UsageError(f"{folder} is not empty: choose a new or empty folder with --dir")
    target = TARGETS[engine]
    package = package_of(name)
    values = dict(asdict(target), title=target.title, name=name, engine=engine, distribution=distribution_of(name), package=package,
                  alias="_toolkit_" + name.replace("-", "_"), toolkit_version=__version__)
    # Written beside the folder, then renamed onto it, with Ctrl-C held to the points between files: a
    # signal or a full disk midway leaves no half skeleton, which the next run would refuse as "not
    # empty", and no staging folder. An existing (empty) folder is kept, never replaced: it may be the
    # shell's current folder (`--dir .`), or carry its owner's mode; the staging folder is made inside it
    # and its entries are renamed into it.
    folder.parent.mkdir(parents=True, exist_ok=True)
    existing = folder.is_dir()
    with interrupts.held() as signals:
        staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder if existing else folder.parent))
        moved: list[Path] = []
        try:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(staging, 0o777 & ~umask)  # mkdtemp's 0700 would outlive the rename
            for relpath, template in FILES.items():
                signals.check()
                path = staging / relpath.replace("PKG", package)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(Template(template).substitute(values), encoding="utf-8")
            signals.check()
            if not existing:
                os.replace(staging, folder)
            else:
                for entry in sorted(staging.iterdir()):
                    os.rename(entry, folder / entry.name)
                    moved.append(folder / entry.name)
                staging.rmdir()
        except BaseException:
            for path in moved:  # (a rename cannot fail for lack of space: this is a rare I/O error's path)
                shutil.rmtree(path, ignore_errors=True)
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return folder


def written_files(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file())
