"""``toolkit repair``: put an engine back to its installed release's files and forget the patch state.

The truth is pip's RECORD for the installed distribution (a sha256 per file). Every file a patch may
have edited, or that the state names, is checked against it; a file that differs comes back from
the backup when the backup verifies, otherwise from the release wheel (``pip download --no-deps``,
cached). The writes are the patch engine's own all-or-nothing path, then the state is cleared.
Works when the manifest is missing or corrupt and when backups are missing or altered. State left
behind by an engine that was uninstalled is removed.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import subprocess
import sys
import zipfile
import zlib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable

from toolkit.engine import patching
from toolkit import patch_registry
from toolkit.kit import _releases as releases
from toolkit.base.cache_files import fresh_private_folder, restrict
from toolkit.engine import fs
from toolkit.base.engines import ENGINE_NAMES
from toolkit.engine.discovery import STATE_DIRNAME, InstalledEngine, _normalize
from toolkit.errors import CorruptManifest, PatchError, io_error
from toolkit.engine.journal import FileChange, write_all_or_nothing
from toolkit.patch_registry import Catalog, markers_in
from toolkit.engine.plan import engine_file, link_refused, refuse_links
from toolkit.engine.sources import SourceTree, load_source
from toolkit.engine.state import FileRecord, Manifest, StateDir, sha256_bytes, sha256_file
from toolkit.base.version import __version__

# (distribution, version) -> a wheel file or an unpacked tree of that release; tests pass their own.
FetchRelease = Callable[[str, str], Path]


@dataclass
class RepairResult:
    engine: str
    distribution: str
    version: str
    restored: dict[str, str] = field(default_factory=dict)  # relpath -> "backup" / "release"
    unverifiable: list[str] = field(default_factory=list)  # not in RECORD: left as they are
    cleared_state: bool = False
    orphan: bool = False  # state of an engine that is no longer installed, removed


def record_hashes(engine: InstalledEngine) -> dict[str, str]:
    """relpath (inside the package) -> sha256 hex, from the installed distribution's RECORD (read
    through ``importlib.metadata``, whose file entries carry RECORD's urlsafe-base64 hashes)."""
    package = Path(engine.package_dir).name
    for dist in metadata.distributions(path=[str(engine.site_dir)]):
        # an email.message.Message: its .get is missing from importlib.metadata's PackageMetadata protocol
        name = _normalize(dist.metadata.get("Name") or "")  # type: ignore[attr-defined]
        if (name, dist.version) != (engine.distribution, engine.version):
            continue
        files = dist.files  # None: RECORD missing or unreadable
        if files is None:
            break
        hashes = {}
        for entry in files:
            if entry.hash is not None and entry.hash.mode == "sha256" and entry.parts[:1] == (package,):
                digest = entry.hash.value
                hashes["/".join(entry.parts[1:])] = base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()
        return hashes
    raise PatchError(f"no readable RECORD for {engine.distribution} {engine.version} in {engine.site_dir}: pip's "
                     "list of the release's files is what repair checks against (reinstall with pip to get it back)")


def pip_download(python: str) -> FetchRelease:
    """The default release source: ``pip download --no-deps DIST==VERSION`` with the engine's own
    interpreter (so the wheel matches its platform), cached under ``$TOOLKIT_CACHE_DIR/wheels``."""

    def fetch(distribution: str, version: str) -> Path:
        cache = releases.cache_dir() / "wheels"  # $TOOLKIT_CACHE_DIR, read (and refused) as the kit reads it
        stem = f"{distribution.replace('-', '_')}-{version}-"
        found = [wheel for wheel in sorted(cache.glob(f"{stem}*.whl")) if _whole_or_dropped(wheel)]
        if not found:
            fs.make_dirs(cache)  # 0755 whatever the umask: no one else puts a wheel there
            partial = cache / f".partial-{distribution}-{version}"
            fresh_private_folder(partial)  # 0700: pip's wheel (0666 under umask 0) is reachable by no one
            try:
                proc = subprocess.run(
                    [python or sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                     "-d", str(partial), f"{distribution}=={version}"],
                    capture_output=True, text=True, check=False, errors="replace",
                )
                for wheel in partial.glob(f"{stem}*.whl"):
                    restrict(wheel)  # 0644 at most, whatever the umask
                    os.replace(wheel, cache / wheel.name)
            finally:
                shutil.rmtree(partial, ignore_errors=True)
            found = sorted(cache.glob(f"{stem}*.whl"))
            if proc.returncode != 0 or not found:
                last = (proc.stderr.strip().splitlines() or ["no output"])[-1][-300:]
                raise PatchError(f"could not download {distribution}=={version} to restore its files ({last}); "
                                 f"download the wheel into {cache} and run repair again")
        return found[0]

    return fetch


def _whole_or_dropped(wheel: Path) -> bool:
    """Whether a cached wheel reads whole (every member's CRC); one that does not (a download cut short,
    a disk error) is deleted, so that the next download replaces it instead of repair failing on it forever."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            if archive.testzip() is None:
                return True
    except (OSError, zipfile.BadZipFile, zlib.error, EOFError, ValueError):
        pass
    with contextlib.suppress(OSError):
        wheel.unlink()
    return False


def repair(engine: InstalledEngine, fetch: FetchRelease | None = None,
           lock_timeout: float = patching.DEFAULT_LOCK_TIMEOUT, *, catalog: Catalog | None = None) -> RepairResult:
    """Restore every file toolkit may have touched to the release's bytes, then clear the state."""
    fetch = fetch or pip_download(engine.python)
    catalog = catalog or patch_registry.catalog(engine.engine)
    state = StateDir(engine.site_dir, engine.engine)
    result = RepairResult(engine.engine, engine.distribution, engine.version)
    expected = record_hashes(engine)
    try:
        with fs.confined(engine.site_dir), state.lock(lock_timeout):  # writes follow no link (fs.confined)
            old_raw = state.read_manifest_bytes()
            try:
                manifest = state.parse_manifest(old_raw) if old_raw is not None else None
            except CorruptManifest:
                manifest = None
            relpaths = _touched_files(catalog, state, manifest)
            release = _Release(engine, fetch)
            changes: list[FileChange] = []
            journal = Manifest(__version__, engine.engine, engine.distribution, engine.version, "reverting",
                               _patches_present(engine, catalog, manifest, relpaths), {})
            for relpath in sorted(relpaths):
                want = expected.get(relpath)
                path = engine_file(engine, relpath)
                if want is None:
                    if os.path.lexists(path):  # absent and not in RECORD: not this release's file, nothing to say
                        result.unverifiable.append(relpath)
                    continue
                current = sha256_file(path)
                # every file is recorded, done or not: a repair stopped mid-way must leave `status` seeing
                # release bytes as "original", not as files the journal does not know
                journal.files[relpath] = FileRecord(want, want, [], [current] if current and current != want else [])
                if current == want:
                    continue
                data, origin = _verified_bytes(state, release, relpath, want)
                result.restored[relpath] = origin
                refuse_links(engine, [relpath])  # only what it writes: reading is fine
                now, mode = fs.read_or_none_with_mode(path)  # the file's own mode, never a link's
                changes.append(FileChange(relpath, path, now, data, 0o644 if mode is None else mode))
            if not changes and old_raw is None and not state.backup_root.exists():
                return result
            write_all_or_nothing(state, old_raw, journal, None, changes, {})
            result.cleared_state = True
    except fs.LinkInTheWay as exc:
        raise link_refused(engine, exc.filename) from None
    except OSError as exc:
        raise io_error(exc, "cannot repair") from None
    return result


def _touched_files(catalog: Catalog, state: StateDir, manifest: Manifest | None) -> set[str]:
    """Files a patch for this engine edits, the manifest names, or a backup exists for."""
    relpaths = catalog.relpaths()
    relpaths |= set(manifest.files if manifest else ())
    relpaths |= set(state.backup_relpaths())
    return relpaths


def _patches_present(engine: InstalledEngine, catalog: Catalog, manifest: Manifest | None, relpaths: set[str]) -> list[str]:
    """While repair writes, `status` must not call a patch whose marker is still in a file "not applied"."""
    ids = set(manifest.patches if manifest else ())
    for relpath in relpaths:
        try:
            ids |= markers_in(fs.read_bytes(engine_file(engine, relpath)))
        except OSError:
            continue
    return [pid for pid in catalog.ids if pid in ids]


class _Release:
    """The release's files, fetched on first need only (the backups usually suffice)."""

    def __init__(self, engine: InstalledEngine, fetch: FetchRelease) -> None:
        self.engine, self.fetch = engine, fetch
        self.source: SourceTree | None = None

    def read(self, relpath: str) -> bytes | None:
        if self.source is None:
            self.source = load_source(self.fetch(self.engine.distribution, self.engine.version))
            if (self.source.distribution, self.source.version) != (self.engine.distribution, self.engine.version):
                raise PatchError(f"the release fetched for {self.engine.distribution} {self.engine.version} is "
                                 f"{self.source.distribution} {self.source.version}")
        return self.source.read(relpath)


def _verified_bytes(state: StateDir, release: _Release, relpath: str, want: str) -> tuple[bytes, str]:
    backup = state.read_backup_or_none(relpath)
    if backup is not None and sha256_bytes(backup) == want:
        return backup, "backup"
    data = release.read(relpath)
    if data is None or sha256_bytes(data) != want:
        # the release's copy is named: a cached download that differs from pip's RECORD is the one to delete
        where = "" if release.source is None else (f" (the release's copy is {release.source.origin}: if that is a "
                                                   "cached download, delete it and run repair again)")
        raise PatchError(f"{relpath}: neither the backup nor the release wheel has the bytes pip's RECORD lists "
                         f"for {state.site_dir}{where}; nothing was written")
    return data, "release"


def orphan_states(site_dirs: list[Path], installed: list[InstalledEngine]) -> list[StateDir]:
    """State directories of engines that are not installed in that site-packages any more."""
    present = {(e.site_dir.resolve(), e.engine) for e in installed}
    orphans = []
    for site_dir in site_dirs:
        for engine_name in sorted(ENGINE_NAMES):
            state = StateDir(site_dir, engine_name)
            if (site_dir / STATE_DIRNAME / engine_name).is_dir() and (site_dir.resolve(), engine_name) not in present:
                orphans.append(state)
    return orphans
