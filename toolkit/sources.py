"""Engine source trees that are not installed: a wheel file or an unpacked tree (``toolkit check``)."""

from __future__ import annotations

import email.parser
import zipfile
from dataclasses import dataclass
from pathlib import Path

from toolkit.discovery import ENGINE_DISTRIBUTIONS, InstalledEngine, _normalize
from toolkit.errors import UsageError


@dataclass(frozen=True)
class SourceTree:
    engine: str
    distribution: str
    version: str
    origin: Path
    package: str

    def read(self, relpath: str) -> bytes | None:
        if self.origin.is_file():
            with zipfile.ZipFile(self.origin) as wheel:
                try:
                    return wheel.read(f"{self.package}/{relpath}")
                except KeyError:
                    return None
        path = self.origin / self.package / relpath
        return path.read_bytes() if path.is_file() else None

    def as_installed(self) -> InstalledEngine:
        """An unpacked tree seen as an install (tests and porting run the whole engine on it)."""
        if self.origin.is_file():
            raise UsageError("a wheel file cannot be patched in place; unpack it first")
        return InstalledEngine(
            self.engine, self.distribution, self.version, str(self.origin / self.package), ""
        )


def _metadata(text: str) -> tuple[str, str]:
    message = email.parser.Parser().parsestr(text, headersonly=True)
    return _normalize(message["Name"] or ""), message["Version"] or ""


def load_source(path: str | Path) -> SourceTree:
    """Open a wheel, a site-packages-like tree, or an engine package directory."""
    origin = Path(path).resolve()
    if not origin.exists():
        raise UsageError(f"source not found: {path}")
    candidates: list[tuple[str, str]] = []
    if origin.is_file():
        if origin.suffix != ".whl":
            raise UsageError(f"{path}: expected a .whl file or a directory")
        with zipfile.ZipFile(origin) as wheel:
            for name in wheel.namelist():
                parts = name.split("/")
                if len(parts) == 2 and parts[0].endswith(".dist-info") and parts[1] == "METADATA":
                    candidates.append(_metadata(wheel.read(name).decode()))
    else:
        if not any(origin.glob("*.dist-info")) and (origin.parent / origin.name).is_dir():
            # An engine package dir itself: its dist-info sits beside it.
            for meta in origin.parent.glob("*.dist-info/METADATA"):
                name, version = _metadata(meta.read_text())
                if name in ENGINE_DISTRIBUTIONS and ENGINE_DISTRIBUTIONS[name][1] == origin.name:
                    engine, package = ENGINE_DISTRIBUTIONS[name]
                    return SourceTree(engine, name, version, origin.parent, package)
        for meta in origin.glob("*.dist-info/METADATA"):
            candidates.append(_metadata(meta.read_text()))
    for name, version in candidates:
        if name in ENGINE_DISTRIBUTIONS:
            engine, package = ENGINE_DISTRIBUTIONS[name]
            return SourceTree(engine, name, version, origin, package)
    raise UsageError(f"{path}: no vLLM or SGLang distribution metadata found")
