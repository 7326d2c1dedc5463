"""What a patch is: an id, an engine, supported versions, and one libcst transformer per edited file.

A patch module declares a :class:`Patch`; the patch engine (``toolkit.engine``) knows nothing of any
one patch. Each transformer subclasses :class:`AnchoredTransformer`, matches engine code by structure
(libcst matchers) and records every anchor it finds, so that a missing or ambiguous anchor fails the
whole apply with the file, the anchor and the engine version named.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, ClassVar, Mapping, Sequence

import libcst as cst
import libcst.matchers as m
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

ENGINES = ("vllm", "sglang")


@dataclass(frozen=True)
class PatchContext:
    """What a transformer may know about the file it edits."""

    patch_id: str
    engine: str
    engine_version: str
    relpath: str

    @property
    def version(self) -> Version:
        return Version(self.engine_version)


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


@dataclass(frozen=True)
class FileEdit:
    """One engine file (path relative to the engine's package dir) and the transformers that edit it."""

    relpath: str
    transformers: Sequence[Callable[[PatchContext], AnchoredTransformer]]


@dataclass(frozen=True)
class Patch:
    id: str
    engine: str
    versions: Sequence[str]  # any-of: ("==0.5.9", "==0.5.23") or (">=0.32,<0.34",)
    files: Sequence[FileEdit]
    summary: str
    runtime_modules: Sequence[str] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"patch {self.id}: unknown engine {self.engine!r}")
        if isinstance(self.versions, str):
            raise TypeError(f"patch {self.id}: versions must be a sequence of specifiers")
        for spec in self.versions:
            SpecifierSet(spec)  # validate early: a bad specifier is a bug in the patch

    @property
    def versions_text(self) -> str:
        return " or ".join(self.versions)

    def supports(self, version: str) -> bool:
        """Whether ``version`` is in the list; a version that is not PEP 440 (``0.5.15.custom-build``)
        is in no list (``--allow-unknown-version`` still tries it)."""
        try:
            parsed = Version(version)
        except InvalidVersion:
            return False
        return any(SpecifierSet(spec).contains(parsed, prereleases=True) for spec in self.versions)
