"""Building and loading the compiled CPU kernels (``csrc/*.cpp``), shared by ``native`` and ``native_spans``.

A kernel is plain C++ (no torch headers: a compile takes about a second) plus the headers beside it
in ``csrc/``, built with the system's ``c++``/``g++`` into ``<TOOLKIT_CACHE_DIR or
~/.cache/toolkit>/superlinear-native/`` under a name keyed by the source, the headers, the compiler,
the flags and the CPU, and called through ``ctypes`` on tensors' data pointers.  It is loaded at
first use (:class:`LazyKernel`); if it cannot be built, one warning line says why and its torch path
runs.  ``TOOLKIT_SUPERLINEAR_NATIVE=0`` turns every kernel off.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

CSRC = Path(__file__).resolve().parent / "csrc"
FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-std=c++17", "-shared", "-fPIC", "-pthread"]


def cache_dir() -> Path:
    root = os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit"
    return Path(root).expanduser() / "superlinear-native"


def compiler() -> str | None:
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def read_source(name: str) -> str:
    """The text of ``csrc/<name>``."""
    return (CSRC / name).read_text()


def _cpu_id() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        return next((line for line in text.splitlines() if line.startswith("flags")), platform.processor())
    except OSError:
        return platform.processor()


def _headers() -> list[str]:
    return [f"{path.name}\n{path.read_text()}" for path in sorted(CSRC.glob("*.h"))]


def compile_source(source: str, stem: str, cxx: str | None) -> Path:
    """The shared library built from ``source`` (C++ that may include ``csrc/``'s headers) by ``cxx``,
    cached under ``cache_dir()`` as ``<stem>-<key>.so``; raises RuntimeError with one line if it cannot."""
    if cxx is None:
        raise RuntimeError("no C++ compiler (c++, g++ or clang++) on PATH")
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    digest = hashlib.sha256("\0".join([source, *_headers(), version, " ".join(FLAGS), platform.machine(),
                                       _cpu_id()]).encode()).hexdigest()[:16]
    target = cache_dir() / f"{stem}-{digest}.so"
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
            src = Path(tmp) / f"{stem}.cpp"
            src.write_text(source)
            built = Path(tmp) / f"{stem}.so"
            proc = subprocess.run([cxx, *FLAGS, f"-I{CSRC}", str(src), "-o", str(built)], capture_output=True,
                                  text=True, timeout=300)
            if proc.returncode != 0:
                first = (proc.stderr.strip().splitlines() or ["no output"])[0]
                raise RuntimeError(f"{Path(cxx).name} failed: {first}")
            os.replace(built, target)  # atomic: concurrent builders leave one complete file
    return target


def load_library(source: str, stem: str, cxx: str | None, symbol: str, argtypes: list) -> ctypes.CDLL:
    """``compile_source(source, stem, cxx)`` loaded, its C function ``symbol`` typed (``int`` result)."""
    lib = ctypes.CDLL(str(compile_source(source, stem, cxx)))
    fn = getattr(lib, symbol)
    fn.restype = ctypes.c_int
    fn.argtypes = argtypes
    return lib


def enabled() -> bool:
    return os.environ.get("TOOLKIT_SUPERLINEAR_NATIVE", "1") not in ("0", "", "false", "no")


class LazyKernel:
    """A compiled kernel loaded at first use: the library, or None when turned off
    (``TOOLKIT_SUPERLINEAR_NATIVE=0``), when ``requires`` is None, or when the build fails (one
    warning line naming ``what`` and the torch path taken instead; not tried again until ``reset``).
    Every one is in ``KERNELS``."""

    def __init__(self, build, what: str, fallback: str, requires=None):
        self._build, self._what, self._fallback, self._requires = build, what, fallback, requires
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = None
        self._tried = False
        self.why_not: str | None = None
        KERNELS.append(self)

    def library(self) -> ctypes.CDLL | None:
        if not enabled() or (self._requires is not None and self._requires() is None):
            return None
        if self._tried:
            return self._lib
        with self._lock:
            if not self._tried:
                try:
                    self._lib = self._build()
                except Exception as exc:  # any failure: the torch path, one warning line
                    self.why_not = f"{type(exc).__name__}: {exc}".splitlines()[0]
                    warnings.warn(f"superlinear: {self._what} unavailable ({self.why_not}); using the "
                                  f"{self._fallback}", RuntimeWarning, stacklevel=4)
                self._tried = True
        return self._lib

    def reset(self) -> None:
        with self._lock:
            self._lib, self._tried, self.why_not = None, False, None


KERNELS: list[LazyKernel] = []


def reset() -> None:
    """Forget the loaded kernels (tests: rebuild, or simulate a machine without a compiler)."""
    for kernel in KERNELS:
        kernel.reset()
