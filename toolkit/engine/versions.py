"""The version rules, checked in one place: which patches an apply applies on the installed release (a
patch's ``versions``, the releases it is proved on, and its ``not_needed``, those served another way)."""

from __future__ import annotations

from typing import Iterable, Sequence

from toolkit.kit._declare import Patch, not_a_release
from toolkit.engine.discovery import InstalledEngine
from toolkit.errors import PatchError


def applicable(engine: InstalledEngine, every: Sequence[Patch], named: Sequence[Patch] | None,
               allow_unknown_version: bool) -> tuple[list[Patch], list[dict[str, str]]]:
    """The one place the version rules are checked (``versions`` and ``not_needed``): the patches an apply
    applies on ``engine`` and those it skips, each skip with why. Named patches (``named``) are applied or
    refused (:func:`check_versions`); with none named, each of ``every`` that the installed release is not
    proved for, or needs no patch on, is skipped. ``allow_unknown_version`` tries them all."""
    if named is not None:
        check_versions(engine, named, allow_unknown_version)
        return list(named), []
    kept, skipped = [], []
    for patch in every:
        why = patch.not_needed_on(engine.version)
        if not why and (allow_unknown_version or patch.supports(engine.version)):
            kept.append(patch)
        elif not allow_unknown_version:
            skipped.append({"patch": patch.id, "reason": "not needed" if why else "not proved",
                            "detail": why or f"declares {patch.versions}"})
    return kept, skipped


def check_versions(engine: InstalledEngine, patches: Iterable[Patch], allow_unknown_version: bool) -> None:
    """Each of ``patches``, named by the user, is proved on the installed release and needed there."""
    for patch in patches:
        why = patch.not_needed_on(engine.version)
        if why and not allow_unknown_version:  # with it, "try anyway" (the compatibility matrix does)
            raise PatchError(f"patch {patch.id} is not needed on {engine.distribution} {engine.version}: {why}; "
                             "nothing was written")
        if not patch.supports(engine.version) and not allow_unknown_version:
            no_release = not_a_release(engine.version)
            what = f" ({no_release})" if no_release else ""
            raise PatchError(
                f"patch {patch.id} supports {engine.engine} {patch.versions_text}, "
                f"but {engine.distribution} {engine.version}{what} is installed at {engine.package_dir}; "
                "allow unknown versions to try anyway (--allow-unknown-version, allow_unknown_version=True in "
                "Python; it still fails on any missing anchor)"
            )
