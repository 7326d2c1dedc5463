"""What a patch declares: an id, an engine, supported versions, the files it edits and, for each, the
transformers that edit it. No libcst here: ``toolkit list``, ``status`` and an apply with nothing to do
read declarations without loading any codemod.

A transformer is named ``"module:Class"`` (loaded only when a file is transformed) or given as the
class itself; either way it is a ``toolkit.codemod.AnchoredTransformer`` taking a :class:`PatchContext`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence, Union

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

ENGINES = ("vllm", "sglang")

TransformerRef = Union[str, Callable[["PatchContext"], Any]]


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


@dataclass(frozen=True)
class FileEdit:
    """One engine file (path relative to the engine's package dir) and the transformers that edit it."""

    relpath: str
    transformers: Sequence[TransformerRef]

    def load_transformers(self) -> list[Callable[[PatchContext], Any]]:
        """The transformer classes, importing the codemod modules named as ``"module:Class"``."""
        loaded = []
        for ref in self.transformers:
            if isinstance(ref, str):
                module, _, name = ref.partition(":")
                ref = getattr(importlib.import_module(module), name)
            loaded.append(ref)
        return loaded


@dataclass(frozen=True)
class Patch:
    id: str
    engine: str
    versions: Sequence[str]  # any-of: ("==0.5.9", "==0.5.23") or (">=0.32,<0.34",)
    files: Sequence[FileEdit]
    summary: str
    runtime_modules: Sequence[str] = field(default_factory=tuple)
    # The patch's own `toolkit verify` checks, ``"module:NAME"`` of a list of checks (loaded only by
    # verify), and the environment a verified server needs for them (e.g. a switch the patch reads).
    verify_checks: str = ""
    verify_env: Sequence[tuple[str, str]] = ()

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"patch {self.id}: unknown engine {self.engine!r}")
        if isinstance(self.versions, str):
            raise TypeError(f"patch {self.id}: versions must be a sequence of specifiers")
        for spec in self.versions:
            SpecifierSet(spec)  # validate early: a bad specifier is a bug in the patch

    def load_verify_checks(self) -> list[Any]:
        """The checks named by ``verify_checks`` (imports their module)."""
        if not self.verify_checks:
            return []
        module, _, name = self.verify_checks.partition(":")
        return list(getattr(importlib.import_module(module), name))

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
