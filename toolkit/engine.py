"""The patch engine: apply, revert, status and check, for any patch of any supported engine.

Every change goes through one reconciliation: given the patches that should be applied to an engine
install, derive each edited file's wanted bytes from its pristine original (the backup), then write
only what differs. Applying more patches and reverting some or all of them are the same operation
with a different target set, so the order of earlier applies never matters.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Sequence

from toolkit.version import __version__
from toolkit.codemod import Patch
from toolkit.discovery import InstalledEngine
from toolkit.errors import DriftError, PatchError, UsageError
from toolkit.sources import SourceTree
from toolkit.state import FileRecord, Manifest, StateDir, atomic_write, remove_stale_bytecode, sha256_bytes, sha256_file
from toolkit.transform import FileTransform, run_transformers, transform_or_raise

NOT_APPLIED = "not applied"
APPLIED = "applied"
PARTIAL = "partial"
DRIFTED = "drifted"

DEFAULT_LOCK_TIMEOUT = 60.0


def registry() -> list[Patch]:
    from patches import all_patches

    return all_patches()


def patches_for(engine: str, patch_ids: Sequence[str] | None = None) -> list[Patch]:
    """The engine's patches in registry order; unknown ids are a usage error."""
    known = registry()
    if patch_ids:
        by_id = {p.id for p in known if p.engine == engine}
        unknown = [pid for pid in patch_ids if pid not in by_id]
        if unknown:
            raise UsageError(
                f"unknown patch for {engine}: {', '.join(unknown)} (known: {', '.join(sorted(by_id)) or 'none'})"
            )
    return [p for p in known if p.engine == engine and (not patch_ids or p.id in patch_ids)]


@dataclass
class FileChange:
    relpath: str
    path: Path
    current: bytes | None
    wanted: bytes

    def diff(self) -> str:
        before = (self.current or b"").decode("utf-8", errors="replace").splitlines(keepends=True)
        after = self.wanted.decode("utf-8", errors="replace").splitlines(keepends=True)
        return "".join(difflib.unified_diff(before, after, f"a/{self.relpath}", f"b/{self.relpath}"))


@dataclass
class Result:
    """What an apply or revert did (or, with dry_run, would do)."""

    engine: InstalledEngine
    patches: list[str]  # the patches applied to the engine afterwards
    changed: list[FileChange] = field(default_factory=list)
    dry_run: bool = False

    @property
    def changed_files(self) -> list[str]:
        return [change.relpath for change in self.changed]

    def diff(self) -> str:
        return "".join(change.diff() for change in self.changed)


@dataclass
class PatchState:
    engine: str
    distribution: str
    engine_version: str
    patch_id: str
    state: str
    supported: bool
    files: dict[str, str]  # relpath -> "patched" / "original" / "drifted" / "missing"
    detail: str = ""


# --------------------------------------------------------------------------------------------------
# planning


def _engine_file(engine: InstalledEngine, relpath: str) -> Path:
    return Path(engine.package_dir) / relpath


def _check_versions(engine: InstalledEngine, patches: Iterable[Patch], allow_unknown_version: bool) -> None:
    for patch in patches:
        if not patch.supports(engine.version) and not allow_unknown_version:
            raise PatchError(
                f"patch {patch.id} supports {engine.engine} {patch.versions_text}, "
                f"but {engine.distribution} {engine.version} is installed at {engine.package_dir}; "
                "use --allow-unknown-version to try anyway (it still fails on any missing anchor)"
            )


def _file_state(current: str | None, record: FileRecord) -> str:
    if current is None:
        return "missing"
    if current == record.after:
        return "patched"
    if current == record.before:
        return "original"
    if current in record.prior:
        return "midway"
    return "drifted"


def _stale_manifest(engine: InstalledEngine, manifest: Manifest) -> bool:
    return manifest.engine_version != engine.version or manifest.distribution != engine.distribution


def _wanted_contents(
    engine: InstalledEngine, state: StateDir, manifest: Manifest | None, target: list[Patch]
) -> tuple[dict[str, bytes], dict[str, bytes], dict[str, list[str]]]:
    """Original and wanted bytes of every file that is or will be edited, and which patches edit it."""
    originals: dict[str, bytes] = {}
    if manifest is not None:
        for relpath, record in manifest.files.items():
            originals[relpath] = state.read_backup(relpath, record.before)
    edits_by_file: dict[str, list[tuple[Patch, object]]] = {}
    for patch in target:
        for edit in patch.files:
            edits_by_file.setdefault(edit.relpath, []).append((patch, edit))
    for relpath in edits_by_file:
        if relpath not in originals:
            path = _engine_file(engine, relpath)
            try:
                originals[relpath] = path.read_bytes()
            except FileNotFoundError:
                owner = edits_by_file[relpath][0][0]
                raise PatchError(
                    f"patch {owner.id}: file {relpath} not found in {engine.package_dir} "
                    f"({engine.engine} {engine.version}); nothing was written"
                ) from None
    wanted: dict[str, bytes] = {}
    patch_ids: dict[str, list[str]] = {}
    for relpath, original in originals.items():
        text = original.decode("utf-8")
        ids: list[str] = []
        for patch, edit in edits_by_file.get(relpath, []):
            text = transform_or_raise(patch, edit, text, engine.version).after  # type: ignore[arg-type]
            ids.append(patch.id)
        wanted[relpath] = text.encode("utf-8") if ids else original
        patch_ids[relpath] = ids
    return originals, wanted, patch_ids


# --------------------------------------------------------------------------------------------------
# the one write path


# Called after each engine file is replaced; the fault tests use it to fail or stop mid-way.
_after_file_write: Callable[[str], None] | None = None


def reconcile(
    engine: InstalledEngine,
    target_ids: Sequence[str],
    *,
    force: bool = False,
    dry_run: bool = False,
    allow_unknown_version: bool = False,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
    reverting: bool = False,
) -> Result:
    """Make exactly ``target_ids`` applied to ``engine``; write nothing unless every file transforms."""
    target = patches_for(engine.engine, list(target_ids)) if target_ids else []
    _check_versions(engine, target, allow_unknown_version)
    state = StateDir(Path(engine.package_dir).parent, engine.engine)
    with state.lock(lock_timeout):
        manifest = state.read_manifest()
        if manifest is not None and _stale_manifest(engine, manifest):
            if not (reverting and force):
                raise DriftError(
                    f"{engine.engine} was reinstalled ({manifest.distribution} {manifest.engine_version} "
                    f"was patched, {engine.distribution} {engine.version} is installed now); run "
                    "`toolkit revert --force` to forget the old patch state",
                    sorted(manifest.files),
                )
            if not dry_run:
                state.clear()  # the backups belong to another install: never restore them here
            return Result(engine, [], [], dry_run)

        if manifest is not None and target:
            _refuse_foreign(engine, manifest.patches, manifest.toolkit_version)
        originals, wanted, patch_ids = _wanted_contents(engine, state, manifest, target)

        drifted = []
        current_sha: dict[str, str | None] = {}
        for relpath in wanted:
            current_sha[relpath] = sha256_file(_engine_file(engine, relpath))
            record = manifest.files.get(relpath) if manifest else None
            if record is not None and _file_state(current_sha[relpath], record) in ("drifted", "missing"):
                drifted.append(relpath)
            elif record is None and current_sha[relpath] != sha256_bytes(originals[relpath]):
                drifted.append(relpath)  # cannot happen for a file read just now, unless racing
        if drifted and not force:
            raise DriftError(
                f"{engine.engine} {engine.version}: changed since patched (left alone; --force to "
                f"overwrite): {', '.join(sorted(drifted))}",
                sorted(drifted),
            )

        changes = [
            FileChange(relpath, _engine_file(engine, relpath), _read_or_none(_engine_file(engine, relpath)), data)
            for relpath, data in sorted(wanted.items())
            if current_sha[relpath] != sha256_bytes(data)
        ]
        applied_ids = [p.id for p in target]
        done = manifest is not None and manifest.state == "applied" and manifest.patches == applied_ids
        if dry_run or (not changes and (done or (manifest is None and not applied_ids))):
            return Result(engine, applied_ids, changes, dry_run)

        # 1. backups of every original not yet saved (a backup never changes once written)
        for relpath, original in originals.items():
            if manifest is None or relpath not in manifest.files:
                state.write_backup(relpath, original)
        # 2. the journal: what every file will be, and what it may still be while we write
        journal = Manifest(
            toolkit_version=__version__,
            engine=engine.engine,
            distribution=engine.distribution,
            engine_version=engine.version,
            state="reverting" if reverting else "applying",
            # While writing, every patch that is or was applied counts as (partly) applied, so that
            # `status` after a crash says "partial" for each, never "not applied".
            patches=[p.id for p in registry() if p.id in set(applied_ids) | set(manifest.patches if manifest else [])],
            files={},
        )
        for relpath, data in wanted.items():
            old = manifest.files.get(relpath) if manifest else None
            prior = sorted({old.after, *old.prior} - {sha256_bytes(data)}) if old else []
            journal.files[relpath] = FileRecord(
                before=sha256_bytes(originals[relpath]), after=sha256_bytes(data), patches=patch_ids[relpath], prior=prior
            )
        state.write_manifest(journal)
        # 3. the engine files, one atomic rename each
        for change in changes:
            atomic_write(change.path, change.wanted)
            remove_stale_bytecode(change.path)
            if _after_file_write is not None:
                _after_file_write(change.relpath)
        # 4. done: forget files back to their original, or everything when nothing stays applied
        if not applied_ids:
            state.clear()
        else:
            journal.state = "applied"
            journal.patches = applied_ids
            journal.files = {r: rec for r, rec in journal.files.items() if rec.patches}
            for record in journal.files.values():
                record.prior = []
            state.write_manifest(journal)
        return Result(engine, applied_ids, changes, False)


def _refuse_foreign(engine: InstalledEngine, applied: Sequence[str], by_version: str) -> None:
    """A patch applied by another toolkit (or one since removed from this one) can be neither kept nor
    re-derived here; dropping it silently would revert it behind the user's back."""
    known = {p.id for p in registry() if p.engine == engine.engine}
    foreign = [pid for pid in applied if pid not in known]
    if foreign:
        raise PatchError(
            f"{engine.engine} {engine.version} has patches applied that this toolkit {__version__} does "
            f"not know: {', '.join(foreign)} (applied by toolkit {by_version}); run `toolkit revert` "
            "first, which restores the originals"
        )


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


# --------------------------------------------------------------------------------------------------
# the verbs


def applied_ids(engine: InstalledEngine) -> list[str]:
    manifest = StateDir(Path(engine.package_dir).parent, engine.engine).read_manifest()
    if manifest is None or _stale_manifest(engine, manifest):
        return []
    return list(manifest.patches)


def apply(
    engine: InstalledEngine,
    patch_ids: Sequence[str] | None = None,
    *,
    dry_run: bool = False,
    allow_unknown_version: bool = False,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> Result:
    """Apply ``patch_ids`` (default: every patch for this engine version) on top of what is applied."""
    candidates = patches_for(engine.engine, patch_ids)
    if not patch_ids and not allow_unknown_version:
        candidates = [p for p in candidates if p.supports(engine.version)]
    wanted = {p.id for p in candidates}
    if not wanted:
        raise PatchError(f"no patch supports {engine.distribution} {engine.version} "
                         f"(see `toolkit list`; --allow-unknown-version to try anyway)")
    target = [p.id for p in registry() if p.engine == engine.engine and (p.id in wanted or p.id in applied_ids(engine))]
    return reconcile(
        engine, target, dry_run=dry_run, allow_unknown_version=allow_unknown_version, lock_timeout=lock_timeout
    )


def revert(
    engine: InstalledEngine,
    patch_ids: Sequence[str] | None = None,
    *,
    force: bool = False,
    dry_run: bool = False,
    lock_timeout: float = DEFAULT_LOCK_TIMEOUT,
) -> Result:
    """Revert ``patch_ids`` (default: all); the others stay applied. Originals come back byte-for-byte."""
    if patch_ids:
        patches_for(engine.engine, patch_ids)  # unknown ids are a usage error
    remaining = [pid for pid in applied_ids(engine) if patch_ids and pid not in patch_ids]
    if remaining:
        manifest = StateDir(Path(engine.package_dir).parent, engine.engine).read_manifest()
        _refuse_foreign(engine, remaining, manifest.toolkit_version if manifest else "?")
    return reconcile(
        engine, remaining, force=force, dry_run=dry_run, lock_timeout=lock_timeout,
        allow_unknown_version=True, reverting=True,
    )


def status(engine: InstalledEngine) -> list[PatchState]:
    """Hash-only state of every patch for ``engine``: no parsing, no lock."""
    state_dir = StateDir(Path(engine.package_dir).parent, engine.engine)
    manifest = state_dir.read_manifest()
    stale = manifest is not None and _stale_manifest(engine, manifest)
    rows = []
    for patch in patches_for(engine.engine):
        files: dict[str, str] = {}
        detail = ""
        if manifest is None or patch.id not in manifest.patches:
            state = NOT_APPLIED
        elif stale:
            state = DRIFTED
            detail = f"patched as {manifest.distribution} {manifest.engine_version}; engine reinstalled since"
        else:
            for edit in patch.files:
                record = manifest.files.get(edit.relpath)
                current = sha256_file(_engine_file(engine, edit.relpath))
                files[edit.relpath] = _file_state(current, record) if record else "unrecorded"
            values = set(files.values())
            if values & {"drifted", "missing", "unrecorded"}:
                state = DRIFTED
                detail = "changed since patched: " + ", ".join(r for r, s in files.items() if s not in ("patched", "original", "midway"))
            elif manifest.state != "applied" or values != {"patched"}:
                state = PARTIAL
                detail = f"an {manifest.state.replace('ing', '')} was interrupted; run apply-patch or revert to finish"
            else:
                state = APPLIED
        rows.append(
            PatchState(engine.engine, engine.distribution, engine.version, patch.id, state,
                       patch.supports(engine.version), files, detail)
        )
    return rows


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

    @property
    def ok(self) -> bool:
        return not self.errors and all(a.ok for a in self.anchors)


def check_source(source: SourceTree, patch_ids: Sequence[str] | None = None) -> list[SourceCheck]:
    """Per patch and per anchor: would it apply to this source tree?

    By default the patches that declare the tree's version (what ``apply-patch`` would apply); when
    none does (porting to a new version), every patch for the engine. Named patches are always checked.
    """
    results = []
    candidates = patches_for(source.engine, patch_ids)
    if not patch_ids and any(p.supports(source.version) for p in candidates):
        candidates = [p for p in candidates if p.supports(source.version)]
    for patch in candidates:
        anchors: list[AnchorCheck] = []
        errors: list[str] = []
        for edit in patch.files:
            data = source.read(edit.relpath)
            if data is None:
                errors.append(f"{edit.relpath}: file not found")
                continue
            try:
                outcome: FileTransform = run_transformers(patch, edit, data.decode("utf-8"), source.version)
            except PatchError as exc:
                errors.append(str(exc))
                continue
            for transformer_name, anchor in outcome.anchors:
                anchors.append(AnchorCheck(patch.id, edit.relpath, transformer_name, anchor.name,
                                           anchor.description, anchor.count, anchor.ok, anchor.problem))
            if outcome.ok:
                try:
                    compile(outcome.after, edit.relpath, "exec")
                except SyntaxError as exc:
                    errors.append(f"{edit.relpath}: patched result does not compile: {exc}")
        results.append(SourceCheck(source, patch.id, patch.supports(source.version), anchors, errors))
    return results
