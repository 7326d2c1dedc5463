"""The codemod base: the libcst transformer every patch edit builds on (declarations: ``toolkit.declare``).

A patch module declares a :class:`Patch`; the patch engine (``toolkit.engine.patching``) knows nothing of any
one patch. Each transformer subclasses :class:`AnchoredTransformer`, matches engine code by structure
(libcst matchers) and records every anchor it finds, so that a missing or ambiguous anchor fails the
whole apply with the file, the anchor and the engine version named.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Callable, ClassVar, Mapping, Sequence, TypeVar

import libcst as cst
import libcst.matchers as m

from toolkit.kit._declare import PatchContext

# Kit API v1 (docs/kit-reference.md); the declarations are re-exported because patches import them from here.
__all__ = ["AnchoredTransformer", "class_named", "in_method", "self_call", "has_params", "is_field",
           "after_last_field", "with_body", "MODULE"]

RUNTIME_ANCHOR = "runtime-import"
MODULE = ""  # INSIDE's key for module-level functions


def class_named(names: str | Sequence[str]) -> m.ClassDef:
    """Matches a class named ``names`` (or any of them: a class that moved between releases)."""
    names = (names,) if isinstance(names, str) else tuple(names)
    return m.ClassDef(name=m.OneOf(*(m.Name(name) for name in names)) if len(names) > 1 else m.Name(names[0]))


_Edit = TypeVar("_Edit", bound=Callable[..., object])


def in_method(class_name: str | Sequence[str], method: str) -> Callable[[_Edit], _Edit]:
    """Gate a matcher-decorated edit to the inside of ``class_name.method`` (the method itself included);
    ``class_name`` may name several classes."""
    def gate(function: _Edit) -> _Edit:
        return m.call_if_inside(class_named(class_name))(
            m.call_if_inside(m.FunctionDef(name=m.Name(method)))(function))
    return gate


def self_call(*names: str) -> m.Call:
    """Matches a call of ``self.<names[0]>.<names[1]>...(...)``."""
    func: m.BaseExpression = m.Name("self")
    for name in names:
        func = m.Attribute(value=func, attr=m.Name(name))
    return m.Call(func=func)


def has_params(function: cst.FunctionDef, *names: str) -> bool:
    """Whether ``function`` takes every one of ``names`` as a positional(-or-keyword) parameter: how
    a codemod tells two shapes of one function apart (a parameter a release added)."""
    params = {param.name.value for param in (*function.params.posonly_params, *function.params.params)}
    return all(name in params for name in names)


def is_field(statement: cst.BaseStatement, name: str | None = None) -> bool:
    """An annotated class attribute (a pydantic or dataclass field), named ``name`` when given."""
    target = m.Name(name) if name else m.Name()
    return m.matches(statement, m.SimpleStatementLine(body=[m.AnnAssign(target=target)]))


def after_last_field(body: Sequence[cst.BaseStatement], new: cst.BaseStatement | Sequence[cst.BaseStatement],
                     before_methods: bool = False) -> list[cst.BaseStatement]:
    """A class body with ``new`` after its last field (first when it has none); with
    ``before_methods``, the last field that comes before the first method."""
    new = [new] if isinstance(new, cst.BaseStatement) else list(new)
    head = body
    if before_methods:
        methods = [position for position, item in enumerate(body) if isinstance(item, cst.FunctionDef)]
        head = body[: methods[0]] if methods else body
    fields = [position for position, item in enumerate(head) if is_field(item)]
    position = fields[-1] + 1 if fields else 0
    return [*body[:position], *new, *body[position:]]


_ClassOrFunction = TypeVar("_ClassOrFunction", cst.ClassDef, cst.FunctionDef)


def with_body(node: _ClassOrFunction, body: Sequence[cst.BaseStatement]) -> _ClassOrFunction:
    """``node`` with its block's statements replaced."""
    return node.with_changes(body=node.body.with_changes(body=list(body)))


class AnchoredTransformer(m.MatcherDecoratableTransformer):
    """A libcst transformer that records the anchors it matched, on libcst's matcher machinery.

    Subclasses list their anchors in ``ANCHORS`` (name -> what it is, for messages) and call
    ``self.hit(name)`` when one matches. Every anchor must be hit exactly once unless it is listed in
    ``MULTI_ANCHORS`` (hit at least once). A subclass may change ``self.anchors`` in ``__init__`` when
    an engine version has different code, but never silently skips an anchor.

    Edits are matcher-decorated methods (``@m.leave(...)``, gated by :func:`in_method` or
    ``m.call_if_inside``). A transformer that sets ``RUNTIME`` (the patch's package, e.g.
    ``"toolkit.patches.sglang.token_ids"``) gets the runtime import written once, by one rule: right
    after the module's first import that is not ``from __future__``, as ``RUNTIME_ALIAS``, with its own
    anchor ``runtime-import``. Set it on exactly one transformer per file that calls a runtime; a pure
    code fix (the edit is plain engine code) sets it on none, and its patch declares no
    ``runtime_modules``. ``INSIDE`` (``{class: methods}``, ``{MODULE: functions}`` for module-level
    ones) limits the pass to where the edits are.
    """

    ANCHORS: ClassVar[Mapping[str, str]] = {}
    MULTI_ANCHORS: ClassVar[frozenset[str]] = frozenset()
    RUNTIME: ClassVar[str] = ""
    RUNTIME_ALIAS: ClassVar[str] = ""
    # Where the edits are, {class name: its method names} ({MODULE: names} for module-level functions);
    # None: anywhere. The pass then skips every other class body and function (libcst visits nothing
    # the edits cannot be in: a first apply of a whole engine stays fast).
    INSIDE: ClassVar[Mapping[str, frozenset[str]] | None] = None

    def __init__(self, context: PatchContext) -> None:
        super().__init__()
        self.context = context
        self.anchors: dict[str, str] = dict(self.ANCHORS)
        if self.RUNTIME:
            self.anchors = {RUNTIME_ANCHOR: "the module's first import (the runtime's goes after it)", **self.anchors}
        self.hits: Counter[str] = Counter()
        self._mark_statement = False
        self._methods = frozenset().union(*self.INSIDE.values()) if self.INSIDE is not None else frozenset()
        self._open_functions: list[bool] = []
        # Without decorated edits, libcst's matcher bookkeeping on every node is pure cost: skip it.
        self._plain = not (getattr(self, "_matchers", None) or getattr(self, "_extra_visit_funcs", None)
                           or getattr(self, "_extra_leave_funcs", None))

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self._plain:
            return cst.CSTTransformer.on_visit(self, node)
        return super().on_visit(node)

    def on_leave(self, original_node, updated_node):  # type: ignore[no-untyped-def]
        if self._plain:
            return cst.CSTTransformer.on_leave(self, original_node, updated_node)
        return super().on_leave(original_node, updated_node)

    # No edit uses visit_<Node>_<attribute> methods: the per-attribute lookups libcst makes for them
    # on every node would be a third of a pass's time.
    def on_visit_attribute(self, node: cst.CSTNode, attribute: str) -> None:
        return None

    def on_leave_attribute(self, original_node: cst.CSTNode, attribute: str) -> None:
        return None

    @property
    def marker(self) -> str:
        """The comment that marks an edit as ours, e.g. ``# toolkit:token-ids``."""
        return f"# toolkit:{self.context.patch_id}"

    def hit(self, anchor: str) -> None:
        """Record that ``anchor`` (a key of ``ANCHORS``) matched; KeyError for an undeclared one."""
        if anchor not in self.anchors:
            raise KeyError(f"{type(self).__name__} records undeclared anchor {anchor!r}")
        self.hits[anchor] += 1

    # ---- the runtime import

    def leave_Module(self, original_node: cst.Module, updated_node: cst.Module) -> cst.Module:
        if not self.RUNTIME:
            return updated_node
        return self.insert_after_first_import(
            updated_node, f"from {self.RUNTIME} import runtime as {self.RUNTIME_ALIAS}", RUNTIME_ANCHOR)

    def insert_after_first_import(self, module: cst.Module, code: str, anchor: str) -> cst.Module:
        """Insert ``code`` after the module's first import that is not ``from __future__``; records
        ``anchor`` when such an import exists."""
        body: list[cst.BaseStatement] = list(module.body)
        future = m.SimpleStatementLine(body=[m.ImportFrom(module=m.Name("__future__"))])
        for position, statement in enumerate(body):
            if m.matches(statement, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])) and not m.matches(
                statement, future
            ):
                self.hit(anchor)
                body.insert(position + 1, self.marked_statement(code))
                break
        return module.with_changes(body=body)

    # ---- marked code: every edit carries the patch's marker comment

    def marked_statement(self, code: str) -> cst.BaseStatement:
        """Injected code (one statement, simple or compound), the marker ending its first line."""
        first, newline, rest = code.partition("\n")
        if rest.strip():
            return cst.parse_statement(f"{first}  {self.marker}\n{rest}")
        return cst.parse_statement(f"{first}  {self.marker}\n")

    def marker_comment(self, existing: cst.Comment | None = None) -> cst.Comment:
        """The marker as a comment node; ``existing`` (a comment already there) kept after it."""
        return cst.Comment(self.marker if existing is None else f"{self.marker}  {existing.value}")

    def marked_line(self, line: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        """``line`` with the marker in its trailing comment (an existing comment is kept after it)."""
        trailing = line.trailing_whitespace
        return line.with_changes(trailing_whitespace=trailing.with_changes(
            whitespace=cst.SimpleWhitespace("  "), comment=self.marker_comment(trailing.comment)))

    def marked_header(self, block: cst.IndentedBlock) -> cst.IndentedBlock:
        """A compound statement's block with the marker on its header line (``for ...:  # toolkit:x``)."""
        header = block.header
        return block.with_changes(header=header.with_changes(
            whitespace=cst.SimpleWhitespace("  "), comment=self.marker_comment(header.comment)))

    def marked_decorator(self, code: str) -> cst.Decorator:
        """``@code`` as a decorator whose line carries the marker."""
        return cst.Decorator(
            decorator=cst.parse_expression(code),
            trailing_whitespace=cst.TrailingWhitespace(whitespace=cst.SimpleWhitespace("  "),
                                                       comment=cst.Comment(self.marker)),
        )

    def around(self, function: cst.FunctionDef, statement: m.BaseMatcherNode, anchor: str,
               new: Sequence[cst.BaseStatement], before: bool = False) -> cst.FunctionDef:
        """``function`` with ``new`` right before (or after) each statement of its body that matches
        ``statement``; each match records ``anchor``."""
        if not isinstance(function.body, cst.IndentedBlock):
            return function
        body = self.around_each(function.body.body, statement, anchor, new, before)
        return function.with_changes(body=function.body.with_changes(body=body))

    def around_each(self, statements: Sequence[cst.BaseStatement], statement: m.BaseMatcherNode, anchor: str,
                    new: Sequence[cst.BaseStatement], before: bool = False) -> list[cst.BaseStatement]:
        """``statements`` (a module's or a block's) with ``new`` right before (or after) each one that
        matches ``statement``; each match records ``anchor``."""
        body: list[cst.BaseStatement] = []
        for item in statements:
            if m.matches(item, statement):
                self.hit(anchor)
                body += [*new, item] if before else [item, *new]
            else:
                body.append(item)
        return body

    def decorated_before(self, function: cst.FunctionDef, decorator: m.BaseMatcherNode, anchor: str,
                         code: str) -> cst.FunctionDef:
        """``function`` with ``code`` as a marked decorator right above its first decorator that matches
        ``decorator`` (which records ``anchor``)."""
        decorators = list(function.decorators)
        for position, existing in enumerate(decorators):
            if m.matches(existing, decorator):
                self.hit(anchor)
                decorators.insert(position, self.marked_decorator(code))
                break
        return function.with_changes(decorators=decorators)

    def before_validator(self, name: str, function: str) -> cst.FunctionDef:
        """A pydantic ``@model_validator(mode="before")`` classmethod ``name`` that hands the raw request
        data to ``function`` (a runtime's), under a blank line and the marker."""
        validator = cst.parse_statement(
            '@model_validator(mode="before")\n@classmethod\n'
            f"def {name}(cls, data):\n    return {function}(data)\n")
        assert isinstance(validator, cst.FunctionDef)  # the code above is one decorated def
        return validator.with_changes(
            leading_lines=[cst.EmptyLine(indent=False), cst.EmptyLine(comment=cst.Comment(self.marker))])

    def mark_this_statement(self) -> None:
        """From an expression's edit: put the marker on the simple statement line that holds it."""
        self._mark_statement = True

    # The plain visit_/leave_ methods below belong to the base; a patch's edits are decorated methods.

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> cst.SimpleStatementLine:
        if not self._mark_statement:
            return updated_node
        self._mark_statement = False
        return self.marked_line(updated_node)

    # ---- skipping what the edits cannot touch (INSIDE)

    def visit_ClassDef(self, node: cst.ClassDef) -> bool:
        return self.INSIDE is None or node.name.value in self.INSIDE

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        if self.INSIDE is None:
            return True
        open_ = bool(self._open_functions and self._open_functions[-1]) or node.name.value in self._methods
        self._open_functions.append(open_)
        return open_

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if self.INSIDE is not None:
            self._open_functions.pop()
        return updated_node

    def anchor_report(self) -> list["AnchorResult"]:
        results = []
        for name, description in self.anchors.items():
            count = self.hits[name]
            ok = count >= 1 if name in self.MULTI_ANCHORS else count == 1
            results.append(AnchorResult(name, description, count, ok))
        return results


@dataclass(frozen=True)
class AnchorResult:
    name: str
    description: str
    count: int
    ok: bool

    @property
    def problem(self) -> str:
        if self.ok:
            return ""
        if self.count == 0:
            return "not found"
        return f"found {self.count} times, expected exactly once"
