"""Engine source trees that are not installed: a wheel file or an unpacked tree (``toolkit check``)."""

from __future__ import annotations

import email.parser
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from toolkit.discovery import ENGINE_DISTRIBUTIONS, InstalledEngine, _normalize
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
    if _normalize(name) in ENGINE_DISTRIBUTIONS and not version:
        raise UsageError(f"{where} names {name} but has no Version field")
    return _normalize(name), version


def load_source(path: str | Path) -> SourceTree:
    """Open a wheel, a site-packages-like tree, or an engine package directory."""
    try:
        return _load_source(path)
    except (OSError, zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise UsageError(f"{path}: cannot read it as a wheel or an engine tree ({exc})") from None


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
            for meta in origin.parent.glob("*.dist-info/METADATA"):
                name, version = _metadata(meta.read_bytes(), str(meta))
                if name in ENGINE_DISTRIBUTIONS and ENGINE_DISTRIBUTIONS[name][1] == origin.name:
                    engine, package = ENGINE_DISTRIBUTIONS[name]
                    return SourceTree(engine, name, version, origin.parent, package)
        for meta in origin.glob("*.dist-info/METADATA"):
            candidates.append(_metadata(meta.read_bytes(), str(meta)))
    for name, version in candidates:
        if name in ENGINE_DISTRIBUTIONS:
            engine, package = ENGINE_DISTRIBUTIONS[name]
            return SourceTree(engine, name, version, origin, package)
    raise UsageError(f"{path}: no vLLM or SGLang distribution metadata found")
