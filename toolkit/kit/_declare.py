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

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from toolkit.base import engines

# Kit API v1 (docs/writing-patches.md, "What is public"; docs/kit-reference.md).
__all__ = ["Patch", "FileEdit", "PatchContext", "KIT_VERSION"]

# The patch kit's public API (docs/writing-patches.md: toolkit.declare, toolkit.codemod, toolkit.testing,
# toolkit.releases, the `toolkit.patches` entry points): raised by any change that breaks a patch
# package written against it, and listed in CHANGELOG.md.
KIT_VERSION = 1

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
    # The releases this file is edited on, one PEP 440 range meeting the patch's (None: every release):
    # for a hook that lives in another file on older releases, ``versions="<0.29"`` here and
    # ``versions=">=0.29"`` on the newer file. A version counts as its release (:func:`release_in`), and
    # every version, declared or tried with --allow-unknown-version, gets the same rule
    # (:meth:`Patch.files_for`): so leave the outermost ranges open (``<0.29``, not ``>=0.24,<0.29``).
    versions: str | None = None

    def edits_on(self, version: str) -> bool:
        """Whether this file is edited on engine ``version``."""
        return self.versions is None or release_in(self.versions, version)

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
    """One patch: its ``id``, its ``engine`` (``"vllm"`` or ``"sglang"``), the one PEP 440 range of
    ``versions`` it is proved on, the ``files`` it edits (each a :class:`FileEdit`) and a one-line
    ``summary``; optionally the ``runtime_modules`` its injected code imports, its ``toolkit verify``
    checks (``verify_checks``, ``verify_env``: kept, no longer read), the releases that need no patch (``not_needed``) and the
    patches it applies ``after``. A patch package exposes it as ``PATCH`` in its ``patch.py``;
    construction refuses (``ValueError``/``TypeError``) an unknown engine, a ``versions`` that is not one
    range with an upper bound, an ``after`` given as a string, and a file declared twice or in a range
    that misses the patch's.
    """

    id: str
    engine: str
    # One PEP 440 range with an upper bound, the newest release the tests prove: ">=0.5.9,<=0.5.23".
    versions: str
    files: Sequence[FileEdit]
    summary: str
    runtime_modules: Sequence[str] = field(default_factory=tuple)
    # Kit API v1 fields kept so declarations written against it still load: the verifier owns its checks
    # (toolkit.verify.checks, each naming the patch it needs, with the environment it needs) and reads
    # neither since issue 52; ``load_verify_checks`` still loads what a declaration names.
    verify_checks: str = ""
    verify_env: Sequence[tuple[str, str]] = ()
    # Releases that need no patch because the engine serves the feature another way (a plugin entry
    # point): (PEP 440 range, why). ``apply-patch`` and ``status`` say so instead of "not supported".
    not_needed: tuple[str, str] = ("", "")
    # Patches (ids, same engine) this one applies after when both are applied. Two patches that edit
    # the same function must be ordered by it (either way); a plan refuses them otherwise.
    after: Sequence[str] = ()

    def __post_init__(self) -> None:
        if self.engine not in engines.ENGINES:
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
        self._check_file_ranges(specs)

    def _check_file_ranges(self, specs: SpecifierSet) -> None:
        """One FileEdit per file, each range valid PEP 440 and meeting the patch's: a declaration error otherwise."""
        seen: set[str] = set()
        for edit in self.files:
            if edit.relpath in seen:  # the same file twice would be transformed twice (and refused)
                raise ValueError(f"patch {self.id}: {edit.relpath} has more than one FileEdit; declare each file "
                                 "once (its transformers find their anchors by structure on every release)")
            seen.add(edit.relpath)
            if edit.versions is None:
                continue
            try:
                own = SpecifierSet(edit.versions) if isinstance(edit.versions, str) else None
            except InvalidSpecifier:
                own = None
            if own is None:
                raise ValueError(f"patch {self.id}: {edit.relpath}: versions {edit.versions!r} is not a PEP 440 "
                                 "range such as '<0.29' (or None: every release of the patch)")
            if not _ranges_meet(specs, own):
                raise ValueError(f"patch {self.id}: {edit.relpath}: versions {edit.versions!r} lies wholly outside "
                                 f"the patch's versions {self.versions!r}, so the file would never be edited")

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

    def files_for(self, version: str) -> tuple[FileEdit, ...]:
        """The files this patch edits on engine ``version``: each FileEdit without a range, and each whose
        range holds the version (as :func:`release_in` reads it). One rule for every version, declared or
        tried with --allow-unknown-version; outside every range, only the files edited on every release."""
        return tuple(edit for edit in self.files if edit.edits_on(version))

    @property
    def relpaths(self) -> tuple[str, ...]:
        """Every file this patch edits on some release, in declaration order."""
        return tuple(edit.relpath for edit in self.files)

    def supports(self, version: str) -> bool:
        """Whether ``version`` is a release this patch is proved on. Versions as users have them: a local
        tag is a build of the release (``0.26.0+cu129``, ``0.32.0+cpu``), and a post release is that release
        repackaged (``0.5.23.post1`` against ``<=0.5.23``): both are inside when the release is. What is no
        release (:func:`not_a_release`) is never proved. ``--allow-unknown-version`` tries any version, and
        the anchors decide."""
        return not not_a_release(version) and release_in(self.versions, version)


def release_in(versions: str, version: str) -> bool:
    """Whether ``version``, read as the release it is a build of, is in the range ``versions``: a local tag
    is a build of the release (``0.26.0+cu129``), a post release that release repackaged (``0.5.23.post1``
    against ``<=0.5.23``), and a development build or release candidate counts as the release it leads to
    (``0.29.0rc1``: 0.29.0; :meth:`Patch.supports` refuses those first). Not PEP 440: in no range."""
    try:
        parsed = Version(version)
    except InvalidVersion:
        return False
    spec = SpecifierSet(versions)
    return spec.contains(Version(parsed.public)) or spec.contains(Version(parsed.base_version))


def _ranges_meet(first: SpecifierSet, second: SpecifierSet) -> bool:
    """Whether some version is in both ranges. A non-empty intersection of PEP 440 ranges holds one of
    their bounds, a version just above one, or 0 (no lower bound): those are tried."""
    points = {Version("0")}
    for spec in (*first, *second):
        try:
            bound = Version(spec.version.removesuffix(".*"))
        except InvalidVersion:  # ``===`` of a string that is no version: only that string matches
            continue
        points |= {bound, Version(f"{bound.base_version}.0.0.0.1")}
    return any(first.contains(v, prereleases=True) and second.contains(v, prereleases=True) for v in points)


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

