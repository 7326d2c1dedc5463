"""The codemod base: the libcst transformer every patch edit builds on (declarations: ``toolkit.declare``).

A patch module declares a :class:`Patch`; the patch engine (``toolkit.engine``) knows nothing of any
one patch. Each transformer subclasses :class:`AnchoredTransformer`, matches engine code by structure
(libcst matchers) and records every anchor it finds, so that a missing or ambiguous anchor fails the
whole apply with the file, the anchor and the engine version named.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import ClassVar, Mapping

import libcst as cst
import libcst.matchers as m

from toolkit.declare import ENGINES, FileEdit, Patch, PatchContext  # noqa: F401 (the names patches import)


class AnchoredTransformer(cst.CSTTransformer):
    """A libcst transformer that records the anchors it matched.

    Subclasses list their anchors in ``ANCHORS`` (name -> what it is, for messages) and call
    ``self.hit(name)`` when one matches. Every anchor must be hit exactly once unless it is listed in
    ``MULTI_ANCHORS`` (hit at least once). A subclass may change ``self.anchors`` in ``__init__`` when
    an engine version has different code, but never silently skips an anchor.
    """

    ANCHORS: ClassVar[Mapping[str, str]] = {}
    MULTI_ANCHORS: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, context: PatchContext) -> None:
        super().__init__()
        self.context = context
        self.anchors: dict[str, str] = dict(self.ANCHORS)
        self.hits: Counter[str] = Counter()

    @property
    def marker(self) -> str:
        """The comment that marks an edit as ours, e.g. ``# toolkit:token-ids``."""
        return f"# toolkit:{self.context.patch_id}"

    def hit(self, anchor: str) -> None:
        if anchor not in self.anchors:
            raise KeyError(f"{type(self).__name__} records undeclared anchor {anchor!r}")
        self.hits[anchor] += 1

    def marked_statement(self, code: str) -> cst.SimpleStatementLine:
        """One line of injected code, carrying the patch's marker comment."""
        return cst.parse_statement(f"{code}  {self.marker}\n")  # type: ignore[return-value]

    def insert_after_first_import(self, module: cst.Module, code: str, anchor: str) -> cst.Module:
        """Insert ``code`` (usually the runtime import) after the module's first import that is not
        ``from __future__``; records ``anchor`` when such an import exists."""
        body = list(module.body)
        future = m.SimpleStatementLine(body=[m.ImportFrom(module=m.Name("__future__"))])
        for position, statement in enumerate(body):
            if m.matches(statement, m.SimpleStatementLine(body=[m.Import() | m.ImportFrom()])) and not m.matches(
                statement, future
            ):
                self.hit(anchor)
                body.insert(position + 1, self.marked_statement(code))
                break
        return module.with_changes(body=body)

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
