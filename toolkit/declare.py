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

# The patch kit's public API (docs/writing-patches.md: toolkit.declare, toolkit.codemod, toolkit.testing,
# toolkit.releases, the `toolkit.patches` entry points): raised by any change that breaks a patch
# package written against it, and listed in CHANGELOG.md.
KIT_VERSION = 1

ENGINES = ("vllm", "sglang")
# Specifier operators that bound a range from above (``==0.5.*`` and ``~=0.5.9`` do too).
UPPER_BOUNDS = ("<", "<=", "==", "~=", "===")

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
    # One PEP 440 range with an upper bound, the newest release the tests prove: ">=0.5.9,<=0.5.23".
    versions: str
    files: Sequence[FileEdit]
    summary: str
    runtime_modules: Sequence[str] = field(default_factory=tuple)
    # The patch's own `toolkit verify` checks, ``"module:NAME"`` of a list of checks (loaded only by
    # verify), and the environment a verified server needs for them (e.g. a switch the patch reads).
    verify_checks: str = ""
    verify_env: Sequence[tuple[str, str]] = ()
    # Releases that need no patch because the engine serves the feature another way (a plugin entry
    # point): (PEP 440 range, why). ``apply-patch`` and ``status`` say so instead of "not supported".
    not_needed: tuple[str, str] = ("", "")
    # Patches (ids, same engine) this one applies after when both are applied. Two patches that edit
    # the same function must be ordered by it (either way); a plan refuses them otherwise.
    after: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"patch {self.id}: unknown engine {self.engine!r}")
        if not isinstance(self.versions, str):
            raise TypeError(f"patch {self.id}: versions must be one range such as '>=0.5.9,<=0.5.23', "
                            f"not {type(self.versions).__name__}")
        if isinstance(self.after, str):
            raise TypeError(f"patch {self.id}: after must be a sequence of patch ids, such as ('tito',), "
                            f"not the string {self.after!r}")
        specs = SpecifierSet(self.versions)  # validate early: a bad specifier is a bug in the patch
        # A release newer than the newest one proved stays refused (--allow-unknown-version tries it).
        if not any(s.operator in UPPER_BOUNDS for s in specs):
            raise ValueError(f"patch {self.id}: versions {self.versions!r} has no upper bound "
                             "(end it with the newest release proved, e.g. '<=0.5.23')")

    def not_needed_on(self, version: str) -> str:
        """Why ``version`` needs no patch (the engine serves the feature itself), or ""."""
        spec, why = self.not_needed
        try:
            return why if spec and SpecifierSet(spec).contains(Version(version), prereleases=True) else ""
        except InvalidVersion:
            return ""

    def load_verify_checks(self) -> list[Any]:
        """The checks named by ``verify_checks`` (imports their module)."""
        if not self.verify_checks:
            return []
        module, _, name = self.verify_checks.partition(":")
        return list(getattr(importlib.import_module(module), name))

    @property
    def versions_text(self) -> str:
        return self.versions

    def supports(self, version: str) -> bool:
        """Whether ``version`` is a release this patch is proved on. Versions as users have them: a local
        tag is a build of the release (``0.26.0+cu129``, ``0.32.0+cpu``), and a post release is that release
        repackaged (``0.5.23.post1`` against ``<=0.5.23``): both are inside when the release is. What is no
        release (:func:`not_a_release`) is never proved. ``--allow-unknown-version`` tries any version, and
        the anchors decide."""
        if not_a_release(version):
            return False
        parsed, spec = Version(version), SpecifierSet(self.versions)
        return spec.contains(Version(parsed.public)) or (parsed.is_postrelease
                                                         and spec.contains(Version(parsed.base_version)))


def not_a_release(version: str) -> str:
    """Why ``version`` names no release at all, in a few words, or "": a development build or release
    candidate (``0.11.1rc2.dev0+g1a2b3c4``, a source checkout's version) is code between releases, and a
    version that is not PEP 440 is no release either. No range proves them."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        return "not a PEP 440 version"
    if parsed.is_prerelease or parsed.is_devrelease:
        return "a development build or release candidate, not a release"
    return ""

