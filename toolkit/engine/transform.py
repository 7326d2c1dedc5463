"""Run a patch's transformers over source text in memory; nothing here touches the disk."""

from __future__ import annotations

import ast
import functools
import hashlib
import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Hashable

import libcst as cst
from packaging.version import InvalidVersion

from toolkit.engine import transform_cache
from toolkit.kit._codemod import AnchorResult
from toolkit.kit._declare import FileEdit, Patch, PatchContext
from toolkit.errors import AnchorError, PatchError


@dataclass(frozen=True)
class FileTransform:
    patch_id: str
    relpath: str
    before: str
    after: str
    anchors: list[tuple[str, AnchorResult]]  # (transformer name, result)

    @property
    def ok(self) -> bool:
        return all(result.ok for _, result in self.anchors)


Finish = Callable[[cst.Module], cst.Module]


# The last results, by everything a result depends on (the transformer classes themselves, not their
# names, so a module loaded again is a new key). A process that plans the same file again (an apply
# over a patch, a revert that keeps one, the fault suite's thousands of runs) runs libcst once, and one
# that checks a file before it patches it (`check` then `apply`, the release matrix's anchors then its
# golden) parses and visits it once: seconds on a large file. Two levels: the transformers' tree before
# ``finish`` (about 100 bytes of memory per byte of source, so only a few), and the finished results.
_VISITED: OrderedDict[Hashable, tuple[cst.Module, list[tuple[str, AnchorResult]]]] = OrderedDict()
_MEMO: OrderedDict[Hashable, FileTransform] = OrderedDict()
_COMPILED: set[Hashable] = set()  # keys of _MEMO whose result compiled
VISITED_SIZE = 12
# The most characters a file a patch edits may hold: the largest any patch edits on a supported release is
# 375 kB (sglang 0.5.16's srt/server_args.py); libcst takes minutes on a 15 MB one (issue 57), so a file
# this big is no engine source and is refused in a sentence before it is parsed.
MAX_SOURCE_CHARS = 4_000_000
MEMO_SIZE = 48


def forget() -> None:
    """Drop every remembered result (tests that change a transformer's behaviour in place call it)."""
    _VISITED.clear()
    _MEMO.clear()
    _COMPILED.clear()


def _memo_keys(patch: Patch, edit: FileEdit, source: str, engine_version: str,
               finish: Finish | None) -> tuple[Hashable, Hashable]:
    """(the key of the transformers' tree, the key of the finished result); (None, None) where nothing
    can key a result: an arbitrary ``finish`` callable, a codemod that does not load."""
    if finish is None:
        finishing: Hashable = None
    elif isinstance(finish, functools.partial) and not finish.args:
        finishing = (finish.func, tuple(sorted(finish.keywords.items())))
    else:
        return None, None
    try:
        transformers = tuple(edit.load_transformers())
        hash(transformers)
    except Exception:  # noqa: BLE001 - not remembered; the run itself reports a codemod that cannot load
        return None, None
    tree = (patch.id, patch.engine, edit.relpath, transformers, engine_version,
            hashlib.sha256(source.encode("utf-8", "surrogatepass")).digest())
    return tree, (tree, finishing)


def _remember(memo: OrderedDict, key: Hashable, value, size: int) -> None:
    memo[key] = value
    while len(memo) > size:
        dropped = memo.popitem(last=False)[0]
        if memo is _MEMO:
            _COMPILED.discard(dropped)


def run_transformers(patch: Patch, edit: FileEdit, source: str, engine_version: str,
                     finish: Finish | None = None) -> FileTransform:
    """Apply every transformer of ``edit`` in order and record each anchor; never raises on anchors.
    ``finish`` rewrites the result last (the patch engine guards the runtime imports with it)."""
    tree_key, key = _memo_keys(patch, edit, source, engine_version, finish)
    if key is not None and key in _MEMO:
        _MEMO.move_to_end(key)
        return _MEMO[key]
    kept = _kept_path(key, edit)
    found = transform_cache.read(kept)
    if isinstance(found, tuple) and len(found) == 3:  # (after, anchors, compiled): another process's result
        after, anchors, compiled = found
        result = FileTransform(patch.id, edit.relpath, source, after, anchors)
        _remember(_MEMO, key, result, MEMO_SIZE)
        if compiled:
            _COMPILED.add(key)
        return result
    try:
        if tree_key is not None and tree_key in _VISITED:
            _VISITED.move_to_end(tree_key)
            module, anchors = _VISITED[tree_key]
        else:
            module, anchors = _visit(patch, edit, source, engine_version)
            if tree_key is not None:
                _remember(_VISITED, tree_key, (module, anchors), VISITED_SIZE)
        if finish is not None:
            module = finish(module)  # a new tree: libcst's nodes are immutable, the remembered one stays
        result = FileTransform(patch.id, edit.relpath, source, module.code, anchors)
    except RecursionError:  # libcst walks its tree recursively, in Python: a long chain of terms overflows it
        raise _too_deep(patch, edit, engine_version, "more than the code transformer can walk") from None
    if key is not None:
        _remember(_MEMO, key, result, MEMO_SIZE)
        transform_cache.write(kept, (result.after, result.anchors, False))
    return result


def _kept_path(key: Hashable, edit: FileEdit):
    """Where ``key``'s result is kept between processes (toolkit/engine/transform_cache.py), or None."""
    if key is None:
        return None
    return transform_cache.entry_path(key, edit.load_transformers())


def _too_deep(patch: Patch, edit: FileEdit, engine_version: str, how: str) -> PatchError:
    return PatchError(f"patch {patch.id}: cannot parse {edit.relpath} ({patch.engine} {engine_version}): its code "
                      f"is nested too deeply ({how}); nothing was written")


def _refuse_too_deep(patch: Patch, edit: FileEdit, source: str, engine_version: str) -> None:
    """libcst's native parser recurses on the C stack: 3000 nested parentheses crash the process
    (SIGSEGV). CPython's own parser bounds every nesting (200 brackets, its recursion limit), so a file
    it refuses for depth is refused here, before libcst sees it. Any other syntax error is left to
    libcst to report (the engine's Python may be newer than this one)."""
    try:
        ast.parse(source)
    except SyntaxError as exc:
        if "too many nested" in str(exc.msg) or "too complex" in str(exc.msg):
            raise _too_deep(patch, edit, engine_version, f"{exc.msg}, line {exc.lineno}") from None
    except (RecursionError, MemoryError):
        raise _too_deep(patch, edit, engine_version, "more than Python's own parser accepts") from None
    except ValueError:  # a NUL byte: libcst reports it
        pass


def _visit(patch: Patch, edit: FileEdit, source: str,
           engine_version: str) -> tuple[cst.Module, list[tuple[str, AnchorResult]]]:
    context = PatchContext(patch.id, patch.engine, engine_version, edit.relpath)
    where = f"patch {patch.id}: cannot parse {edit.relpath} ({patch.engine} {engine_version})"
    if len(source) > MAX_SOURCE_CHARS:
        raise PatchError(f"{where}: it holds {len(source):,} characters, more than the {MAX_SOURCE_CHARS:,} an "
                         "engine source file may (the largest a patch edits is under 400,000)")
    if "\0" in source:  # libcst blames line 1 for it, in five lines; Python refuses the file outright
        before = source[:source.index("\0")]
        line, column = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
        raise PatchError(f"{where}: a NUL byte at line {line}, column {column}, which no Python source holds")
    _refuse_too_deep(patch, edit, source, engine_version)
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as exc:  # one sentence: libcst's own text spans lines, with a caret
        raise PatchError(f"{where}: {exc.message.splitlines()[0]} at line {exc.raw_line}, column {exc.raw_column + 1}"
                         ) from exc
    if re.search(rf"# toolkit:{re.escape(patch.id)}(?![A-Za-z0-9_.-])", source):
        # A codemod knows its own marker: a file that carries it is patched already, whatever a
        # manifest says, and patching it again would double every edit.
        raise PatchError(
            f"patch {patch.id}: {edit.relpath} already carries its marker `# toolkit:{patch.id}` "
            f"({patch.engine} {engine_version}); it is patched already, not patching it twice"
        )
    anchors: list[tuple[str, AnchorResult]] = []
    for make_transformer in edit.load_transformers():
        try:
            transformer = make_transformer(context)
            module = module.visit(transformer)
        except InvalidVersion:
            raise PatchError(
                f"patch {patch.id}: {patch.engine} version {engine_version!r} is not a PEP 440 version, and "
                f"{getattr(make_transformer, '__name__', 'a transformer')} picks its code path by version; "
                "nothing was written"
            ) from None
        anchors.extend((type(transformer).__name__, result) for result in transformer.anchor_report())
    return module, anchors


def transform_or_raise(patch: Patch, edit: FileEdit, source: str, engine_version: str,
                       finish: Finish | None = None) -> FileTransform:
    """Like :func:`run_transformers`, but a missing anchor or a result that does not compile raises."""
    result = run_transformers(patch, edit, source, engine_version, finish)
    _, key = _memo_keys(patch, edit, source, engine_version, finish)
    for transformer_name, anchor in result.anchors:
        if not anchor.ok:
            raise AnchorError(
                patch_id=patch.id,
                relpath=edit.relpath,
                anchor=f"{anchor.name} ({anchor.description}) in {transformer_name}",
                engine=patch.engine,
                engine_version=engine_version,
                problem=anchor.problem,
            )
    if key is not None and key in _COMPILED:
        return result
    try:
        compile(result.after, edit.relpath, "exec")
    except SyntaxError as exc:
        raise PatchError(
            f"patch {patch.id}: the patched {edit.relpath} does not compile "
            f"({patch.engine} {engine_version}): {exc}"
        ) from exc
    if key is not None and key in _MEMO:
        _COMPILED.add(key)
        transform_cache.write(_kept_path(key, edit), (result.after, result.anchors, True))
    return result
