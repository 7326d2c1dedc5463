"""``toolkit check --source``: would each patch apply to a source tree or a wheel (the porting tool)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

from toolkit.kit._declare import FileEdit, Patch
from toolkit.errors import PatchError
from toolkit.engine.sources import SourceTree
from toolkit import patch_registry
from toolkit.patch_registry import Catalog

if TYPE_CHECKING:
    from toolkit.engine.transform import FileTransform  # libcst: only when a file is transformed


@dataclass
class AnchorCheck:
    patch_id: str
    relpath: str
    transformer: str
    anchor: str
    description: str
    found: int
    ok: bool
    problem: str


@dataclass
class SourceCheck:
    source: SourceTree
    patch_id: str
    supported: bool
    anchors: list[AnchorCheck]
    errors: list[str]
    not_needed: str = ""  # why the release needs no patch (``Patch.not_needed``), or ""

    @property
    def ok(self) -> bool:
        return not self.errors and all(a.ok for a in self.anchors)


def file_outcomes(source: SourceTree, patch: Patch) -> Iterator[tuple[FileEdit, FileTransform | None, str]]:
    """For each file ``patch`` edits on ``source``'s release (:meth:`Patch.files_for`): (the edit, its
    transformers' outcome on ``source``'s copy, "") or (the edit, None, why it could not run: missing
    file, not UTF-8, a refusal of the codemod)."""
    from toolkit.engine.transform import run_transformers  # libcst

    for edit in patch.files_for(source.version):
        data = source.read(edit.relpath)
        if data is None:
            yield edit, None, f"{edit.relpath}: file not found"
            continue
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            yield edit, None, f"{edit.relpath}: not UTF-8 text ({exc})"
            continue
        try:
            yield edit, run_transformers(patch, edit, text, source.version), ""
        except PatchError as exc:
            yield edit, None, str(exc)


def check_source(source: SourceTree, patches: Sequence[Patch] | None = None, *,
                 catalog: Catalog | None = None) -> list[SourceCheck]:
    """Per patch and per anchor: would it apply to this source tree?

    By default the patches that declare the tree's version (what ``apply-patch`` would apply); when
    none does (porting to a new version), every patch of the engine's ``catalog`` (default: the registry,
    read now, for a caller below a command's edge). Named ``patches`` are always checked.
    """
    results = []
    candidates = list(patches) if patches else list((catalog or patch_registry.catalog(source.engine)).patches)
    if not patches and any(p.supports(source.version) for p in candidates):
        candidates = [p for p in candidates if p.supports(source.version)]
    for patch in candidates:
        anchors: list[AnchorCheck] = []
        errors: list[str] = []
        for edit, outcome, error in file_outcomes(source, patch):
            if outcome is None:
                errors.append(error)
                continue
            for transformer_name, anchor in outcome.anchors:
                anchors.append(AnchorCheck(patch.id, edit.relpath, transformer_name, anchor.name,
                                           anchor.description, anchor.count, anchor.ok, anchor.problem))
            if outcome.ok:
                try:
                    compile(outcome.after, edit.relpath, "exec")
                except SyntaxError as exc:
                    errors.append(f"{edit.relpath}: patched result does not compile: {exc}")
        results.append(SourceCheck(source, patch.id, patch.supports(source.version), anchors, errors,
                                   patch.not_needed_on(source.version)))
    return results
