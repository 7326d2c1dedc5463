"""Engine source trees that are not installed: a wheel file or an unpacked tree (``toolkit check``)."""

from __future__ import annotations

import email.parser
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from toolkit.base.engines import DISTRIBUTIONS, titles
from toolkit.engine.discovery import InstalledEngine, _normalize, owning_distribution
from toolkit.errors import PatchError, UsageError


@dataclass(frozen=True)
class SourceTree:
    engine: str
    distribution: str
    version: str
    origin: Path
    package: str

    def read(self, relpath: str) -> bytes | None:
        try:
            if self.origin.is_file():
                with zipfile.ZipFile(self.origin) as wheel:
                    try:
                        return wheel.read(f"{self.package}/{relpath}")
                    except KeyError:
                        return None
            path = self.origin / self.package / relpath
            return path.read_bytes() if path.is_file() else None
        except (OSError, zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise PatchError(f"{self.origin}: cannot read {relpath} ({exc})") from None

    def as_installed(self) -> InstalledEngine:
        """An unpacked tree seen as an install (tests and porting run the whole engine on it)."""
        if self.origin.is_file():
            raise UsageError("a wheel file cannot be patched in place; unpack it first")
        return InstalledEngine(
            self.engine, self.distribution, self.version, str(self.origin / self.package), ""
        )


def _metadata(raw: bytes, where: str) -> tuple[str, str]:
    """(normalized name, version) from a METADATA file; a file that is not one is a usage error."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise UsageError(f"{where} is not UTF-8 text, so not distribution metadata") from None
    message = email.parser.Parser().parsestr(text, headersonly=True)
    name, version = str(message["Name"] or "").strip(), str(message["Version"] or "").strip()
    if _normalize(name) in DISTRIBUTIONS and not version:
        raise UsageError(f"{where} names {name} but has no Version field")
    return _normalize(name), version


def _owner_first(origin: Path, claims: list[tuple[str, str, Path]]) -> list[tuple[str, str]]:
    """(name, version) of the dist-infos in ``origin`` that name an engine, the one that owns the
    package's files first (the rule of ``toolkit.engine.discovery.owning_distribution``, as for an install)."""
    import importlib.metadata

    if len(claims) > 1:
        served = DISTRIBUTIONS[claims[0][0]]
        rivals = [c for c in claims if DISTRIBUTIONS[c[0]] == served]
        dists: list[tuple[str, importlib.metadata.Distribution]] = [
            (name, importlib.metadata.PathDistribution(info)) for name, _, info in rivals]
        first = rivals[dists.index(owning_distribution(origin / served.package, served.name, dists))]
        claims = [first] + [c for c in claims if c is not first]
    return [(name, version) for name, version, _ in claims]


def load_source(path: str | Path, release: tuple[str, str] | None = None) -> SourceTree:
    """Open a wheel, a site-packages-like tree, or an engine package directory. ``release``
    (``(dist, version)``, see :func:`toolkit.releases.parse_release`) names the release instead of its
    dist-info metadata: a bare engine folder (a source checkout, a copied package) has none."""
    if not str(path).strip() or "\0" in str(path):  # an empty --source would read the working directory
        raise UsageError(f"{str(path)!r} is not a path to a wheel or an engine tree")
    try:
        if release is not None:
            return _named_release(path, release)
        return _load_source(path)
    except (OSError, zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise UsageError(f"{path}: cannot read it as a wheel or an engine tree ({exc})") from None


def _named_release(path: str | Path, release: tuple[str, str]) -> SourceTree:
    """The engine folder ``path`` (the package folder itself, or a folder holding it) as ``release``."""
    dist, version = release
    if _normalize(dist) not in DISTRIBUTIONS or not version:
        raise UsageError(f"{dist}=={version}: not a {titles()} release")
    served = DISTRIBUTIONS[_normalize(dist)]
    engine, package = served.name, served.package
    origin = Path(path).resolve()
    if origin.is_file() and origin.suffix == ".whl":
        raise UsageError(f"{path}: a wheel names its own release; --release is for a folder without metadata")
    if origin.is_dir() and origin.name == package and (origin / "__init__.py").is_file():
        return SourceTree(engine, _normalize(dist), version, origin.parent, package)
    if (origin / package).is_dir():
        return SourceTree(engine, _normalize(dist), version, origin, package)
    if not origin.exists():
        raise UsageError(f"source not found: {path}")
    raise UsageError(f"{path}: not {dist}'s package folder ({package}/) nor a folder holding one")


def _load_source(path: str | Path) -> SourceTree:
    origin = Path(path).resolve()
    if not origin.exists():
        raise UsageError(f"source not found: {path}")
    candidates: list[tuple[str, str]] = []
    if origin.is_file():
        if origin.suffix != ".whl":
            raise UsageError(f"{path}: expected a .whl file or a directory")
        if not zipfile.is_zipfile(origin):
            raise UsageError(f"{path}: not a wheel (not a zip archive)")
        with zipfile.ZipFile(origin) as wheel:
            for name in wheel.namelist():
                parts = name.split("/")
                if len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "METADATA":
                    candidates.append(_metadata(wheel.read(name), f"{path}: {name}"))
    else:
        if not any(origin.glob("*.dist-info")) and (origin.parent / origin.name).is_dir():
            # An engine package dir itself: its dist-info sits beside it.
            beside = []
            for meta in sorted(origin.parent.glob("*.dist-info/METADATA")):
                name, version = _metadata(meta.read_bytes(), str(meta))
                if name in DISTRIBUTIONS and DISTRIBUTIONS[name].package == origin.name:
                    beside.append((name, version, meta.parent))
            for name, version in _owner_first(origin.parent, beside)[:1]:
                served = DISTRIBUTIONS[name]
                return SourceTree(served.name, name, version, origin.parent, served.package)
        claims = []
        for meta in sorted(origin.glob("*.dist-info/METADATA")):
            name, version = _metadata(meta.read_bytes(), str(meta))
            if name in DISTRIBUTIONS:
                claims.append((name, version, meta.parent))
        candidates.extend(_owner_first(origin, claims))
    for name, version in candidates:
        if name in DISTRIBUTIONS:
            served = DISTRIBUTIONS[name]
            return SourceTree(served.name, name, version, origin, served.package)
    raise UsageError(f"{path}: no {titles()} distribution metadata found (a *.dist-info/METADATA beside the "
                     "package); for a folder without it, name the release: --release DIST==VERSION")
