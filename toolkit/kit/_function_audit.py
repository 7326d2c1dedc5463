"""``toolkit audit``: a framework's copy of an engine function, against that function in every release.

RL frameworks replace engine methods with copies (a monkeypatch assigns a copied ``def``); a release
that changes the method leaves the copy running the old code. This compares them by structure: each
function becomes its statements, each normalised by ``ast.unparse`` (formatting, comments and
annotations gone; a compound statement by its header, e.g. ``for x in y:``) and keyed by the headers
of the blocks around it, so a line is matched where it sits, not by its line number. Docstrings and
the copy's own name and decorators are left out.

The copy's own edits are not findings: a **base** release (``--base``, or the release whose function
is closest to the copy, the oldest of equals) stands for what the copy was written against. Per
release R, what changed upstream between the base and R is then checked against the copy:

* **drops**: a statement R has and the base did not, which the copy lacks;
* **freezes**: a statement the base had and R changed or removed, which the copy still has.

A copy is *current* on R when it drops and freezes nothing there, *stale* otherwise, and the function
may be *absent* from R. Statements are compared as counted sets per block: a pure reordering inside
a block is not reported.
"""

from __future__ import annotations

import ast
import copy as _copy
import hashlib
import importlib.util
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, Sequence

from toolkit.base import engines
from toolkit.kit import _releases as releases
from toolkit.errors import PatchError, UsageError

BLOCKS = ("body", "orelse", "handlers", "finalbody", "cases")
Key = tuple[tuple[str, ...], str]
Defs = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


@dataclass(frozen=True)
class Statement:
    """One statement of a function: the headers of the blocks around it, its normalised code, its line."""

    inside: tuple[str, ...]
    code: str
    line: int

    @property
    def key(self) -> Key:
        return self.inside, self.code


@dataclass
class Function:
    where: str  # "path:line"
    statements: list[Statement]

    def counts(self) -> Counter[Key]:
        return Counter(s.key for s in self.statements)

    @property
    def digest(self) -> str:
        return hashlib.sha256(repr(sorted(self.counts().items())).encode()).hexdigest()


@dataclass
class ReleaseAudit:
    dist: str
    version: str
    state: str  # "current", "stale", "absent"
    where: str = ""  # the upstream function, "relpath:line"
    drops: list[Statement] = field(default_factory=list)
    freezes: list[Statement] = field(default_factory=list)
    changed_since_base: int = 0  # statements upstream added or removed since the base
    digest: str = ""

    @property
    def release(self) -> str:
        return f"{self.dist}=={self.version}"


@dataclass
class Audit:
    copy: str  # "path:line" of the copied function
    copy_qualname: str
    upstream: str  # "module:qualname"
    base: str  # "dist==version"
    base_chosen: str  # "given" or "closest to the copy (N statements apart)"
    releases: list[ReleaseAudit]

    @property
    def stale_on(self) -> list[str]:
        return [r.release for r in self.releases if r.state != "current"]


# ---- a function as its statements


def _header(node: ast.AST, top: bool = False) -> str:
    """A compound statement's first line, normalised: its blocks emptied, annotations dropped."""
    if isinstance(node, ast.ExceptHandler):
        kind = f" {ast.unparse(node.type)}" if node.type else ""
        return f"except{kind}{f' as {node.name}' if node.name else ''}:"
    if isinstance(node, ast.match_case):
        guard = f" if {ast.unparse(node.guard)}" if node.guard else ""
        return f"case {ast.unparse(node.pattern)}{guard}:"
    clone = _copy.copy(node)
    for name in BLOCKS:
        if hasattr(clone, name):
            setattr(clone, name, [ast.Pass()] if name == "body" else [])
    if isinstance(clone, (ast.FunctionDef, ast.AsyncFunctionDef)):
        clone.returns = None
        clone.args = _copy.deepcopy(clone.args)
        for arg in (*clone.args.posonlyargs, *clone.args.args, *clone.args.kwonlyargs, clone.args.vararg,
                    clone.args.kwarg):
            if arg is not None:
                arg.annotation = None
        if top:  # the copy's own name and decorators are how it is installed, not what it does
            clone.decorator_list = []
            clone.name = "<function>"
    lines = [line.strip() for line in ast.unparse(clone).splitlines()]
    return " ".join(line for line in lines if line and line != "pass")


def _is_docstring(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _flatten(body: Sequence[ast.AST], inside: tuple[str, ...], out: list[Statement], in_def: bool) -> None:
    for position, node in enumerate(body):
        if in_def and position == 0 and isinstance(node, ast.stmt) and _is_docstring(node):
            continue
        compound = any(isinstance(getattr(node, name, None), list) for name in BLOCKS) or isinstance(
            node, (ast.ExceptHandler, ast.match_case))
        if not compound:
            out.append(Statement(inside, ast.unparse(node), getattr(node, "lineno", 0)))
            continue
        header = _header(node)
        out.append(Statement(inside, header, getattr(node, "lineno", 0)))
        for name in BLOCKS:
            block = getattr(node, name, None)
            if block:
                label = header if name in ("body", "handlers", "cases") else f"{header} ({name})"
                _flatten(block, inside + (label,), out, isinstance(node, Defs) and name == "body")


def statements_of(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[Statement]:
    out = [Statement((), _header(node, top=True), node.lineno)]
    _flatten(node.body, (), out, True)
    return out


# ---- finding a function by qualname


def _defs_in(body: Sequence[ast.AST]) -> Iterator[ast.AST]:
    """The defs and classes of a block, also those under its if/try/with statements."""
    for node in body:
        if isinstance(node, Defs):
            yield node
        else:
            for name in BLOCKS:
                yield from _defs_in(getattr(node, name, None) or [])


def qualname_parts(qualname: str) -> list[str]:
    parts = [p for p in qualname.split(".") if p and p != "<locals>"]
    if not parts or not all(p.isidentifier() for p in parts):
        raise UsageError(f"{qualname!r} is not a qualified name such as Class.method or function.inner")
    return parts


def find_function(tree: ast.Module, parts: Sequence[str]) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The function at ``parts`` (the last one defined, as Python would keep it), or None."""
    body: Sequence[ast.AST] = tree.body
    found: ast.AST | None = None
    for part in parts:
        named = [n for n in _defs_in(body) if getattr(n, "name", None) == part]
        if not named:
            return None
        found = named[-1]
        body = found.body  # type: ignore[attr-defined]
    return found if isinstance(found, (ast.FunctionDef, ast.AsyncFunctionDef)) else None


def functions_named(tree: ast.Module, name: str) -> list[str]:
    """The qualnames of every function called ``name`` in ``tree``, at any depth."""
    found: list[str] = []

    def walk(body: Sequence[ast.AST], prefix: str) -> None:
        for node in _defs_in(body):
            qualname = f"{prefix}{node.name}"  # type: ignore[attr-defined]
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
                found.append(qualname)
            walk(node.body, qualname + ".")  # type: ignore[attr-defined]

    walk(tree.body, "")
    return found


def parse(text: str, where: str, error: type[PatchError] = UsageError) -> ast.Module:
    """``text`` parsed; a syntax error is one sentence (a usage error for the user's copy; a release this
    Python cannot parse, newer syntax, is a plain failure, exit 1)."""
    try:
        return ast.parse(text)
    except SyntaxError as exc:
        raise error(f"{where} does not parse as Python {sys.version_info[0]}.{sys.version_info[1]}: {exc.msg} "
                    f"(line {exc.lineno})") from None


# ---- the copy


def load_copy(spec: str, qualname: str | None, upstream_name: str) -> tuple[Function, str]:
    """The copied function: ``spec`` is a file, ``FILE:QUALNAME``, or an importable ``module:qualname``
    (its source is read, not run). Without a qualname, the one function of the file named like the
    engine's. Returns the function and its qualname."""
    path, _, named = spec.partition(":") if not Path(spec).is_file() else (spec, "", "")
    if Path(path).is_file() or path.endswith(".py"):
        file = Path(path)
    elif named:
        file = _module_file(path)
    else:
        raise UsageError(f"{spec}: no such file (give a .py file, FILE:QUALNAME or an importable module:qualname)")
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {file}: {exc}") from None
    tree = parse(text, str(file))
    qualname = qualname or named
    if not qualname:
        candidates = functions_named(tree, upstream_name)
        if len(candidates) != 1:
            what = f"{len(candidates)} functions ({', '.join(candidates)})" if candidates else "no function"
            raise UsageError(f"{file} has {what} named {upstream_name}: name the copy with --copy-qualname QUALNAME "
                             "(or FILE:QUALNAME)")
        qualname = candidates[0]
    node = find_function(tree, qualname_parts(qualname))
    if node is None:
        raise UsageError(f"{file} has no function {qualname}")
    return Function(f"{file}:{node.lineno}", statements_of(node)), qualname


def _module_file(module: str) -> Path:
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError) as exc:
        raise UsageError(f"cannot find module {module}: {exc}") from None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise UsageError(f"cannot find the Python source of module {module} on this interpreter's path")
    return Path(spec.origin)


# ---- the engine's function on each release


def parse_upstream(upstream: str) -> tuple[str, list[str], list[str]]:
    """``vllm.v1.core.sched.scheduler:Scheduler.method`` -> (engine, candidate relpaths, qualname parts)."""
    module, sep, qualname = upstream.partition(":")
    top = module.split(".")[0]
    packages = {engine.package for engine in engines.ENGINES.values()}
    if not sep or not qualname or top not in packages or not all(p.isidentifier() for p in module.split(".")):
        raise UsageError(f"{upstream!r}: expected the engine's module:qualname, such as "
                         "vllm.v1.core.sched.scheduler:Scheduler._update_from_kv_xfer_finished")
    rest = "/".join(module.split(".")[1:])
    relpaths = [f"{rest}.py", f"{rest}/__init__.py"] if rest else ["__init__.py"]
    return top, relpaths, qualname_parts(qualname)


def upstream_function(dist: str, version: str, relpaths: Sequence[str], parts: Sequence[str],
                      offline: bool) -> Function | None:
    from toolkit import patch_registry

    try:  # a tree cut anyway also takes every registered patch's files: a later matrix run reuses it
        tree = releases.release_tree(dist, version, relpaths, offline=offline,
                                     widen_to=sorted(patch_registry.catalog(releases.LINES[dist][0]).relpaths()))
    except PatchError as exc:
        if offline and not isinstance(exc, UsageError):
            raise UsageError(f"{dist}=={version} is not in the cache with {relpaths[0]}, and --offline forbids "
                             "the download (run once without --offline)") from None
        raise
    for relpath in relpaths:
        data = tree.read(relpath)
        if data is None:
            continue
        where = f"{dist}=={version} {relpath}"
        module = parse(data.decode("utf-8", errors="replace"), where, PatchError)
        node = find_function(module, parts)
        return Function(f"{relpath}:{node.lineno}", statements_of(node)) if node else None
    return None


def three_way(base: Function, release: Function, copy: Function) -> tuple[list[Statement], list[Statement], int]:
    """(drops, freezes, statements changed since the base) of ``copy`` on ``release``."""
    b, r, c = base.counts(), release.counts(), copy.counts()
    drops = [s for s in _each(release.statements, lambda k: min(r[k] - b[k], r[k] - c[k]))]
    freezes = [s for s in _each(copy.statements, lambda k: min(b[k] - r[k], c[k] - r[k]))]
    return drops, freezes, sum(((r - b) + (b - r)).values())


def _each(statements: Sequence[Statement], wanted: Callable[[Key], int]) -> Iterator[Statement]:
    """The statements whose key ``wanted`` counts above zero, that many of each (the first ones)."""
    left: dict[Key, int] = {}
    for statement in statements:
        n = left.setdefault(statement.key, wanted(statement.key))
        if n > 0:
            left[statement.key] = n - 1
            yield statement


def distance(one: Function, other: Function) -> int:
    a, b = one.counts(), other.counts()
    return sum(((a - b) + (b - a)).values())


def audit(copy_spec: str, upstream: str, *, copy_qualname: str | None = None,
          chosen: Sequence[tuple[str, str]] = (), base: tuple[str, str] | None = None, offline: bool = False,
          progress: Callable[[str], None] | None = None) -> Audit:
    """The copy against the engine's function on every release of ``chosen`` (default: every known release
    of the engine's lines; ``offline``: those cached)."""
    engine, relpaths, parts = parse_upstream(upstream)
    copy, qualname = load_copy(copy_spec, copy_qualname, parts[-1])
    if not chosen:
        from toolkit.kit._matrix import choose_releases

        chosen = choose_releases([engine], offline=offline)
    wrong = [f"{d}=={v}" for d, v in chosen if releases.LINES[d][0] != engine]
    if wrong or (base and releases.LINES[base[0]][0] != engine):
        raise UsageError(f"{', '.join(wrong) or '=='.join(base or ())} is not a {engine} release")
    if not chosen:
        raise UsageError(f"no {engine} release is cached ({releases.cache_dir()}); run once without --offline")
    ordered = sorted(dict.fromkeys(chosen), key=_order)
    found: dict[tuple[str, str], Function | None] = {}
    for dist, version in dict.fromkeys([*ordered, *([base] if base else [])]):
        if progress:
            progress(f"reading {dist} {version}")
        found[(dist, version)] = upstream_function(dist, version, relpaths, parts, offline)
    present = [(release, f) for release, f in found.items() if f is not None]
    if not present:
        raise UsageError(f"no release asked has {upstream} (checked {len(found)}: "
                         f"{', '.join(f'{d}=={v}' for d, v in found)})")
    if base is not None:
        base_function = found[base]
        if base_function is None:
            raise UsageError(f"the base {base[0]}=={base[1]} has no {upstream}")
        base_release, how = base, "given"
    else:
        base_release, base_function = min(present, key=lambda item: (distance(copy, item[1]), _order(item[0])))
        how = f"closest to the copy ({distance(copy, base_function)} statements apart)"
    rows = []
    for dist, version in ordered:
        function = found[(dist, version)]
        if function is None:
            rows.append(ReleaseAudit(dist, version, "absent"))
            continue
        drops, freezes, changed = three_way(base_function, function, copy)
        rows.append(ReleaseAudit(dist, version, "stale" if drops or freezes else "current", function.where,
                                 drops, freezes, changed, function.digest))
    return Audit(copy.where, qualname, upstream, "==".join(base_release), how, rows)


def _order(release: tuple[str, str]) -> tuple[int, object]:
    from toolkit.kit._matrix import release_order

    return release_order(release)
