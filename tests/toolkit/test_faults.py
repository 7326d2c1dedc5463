"""Fault injection: every file-system call the patch engine makes (all go through ``toolkit.engine.fs``) fails
in turn, with each errno, once or for good (a full or read-only disk stays so), or the process is
SIGKILLed at that call. After each fault: every file is original or fully patched, ``status`` tells the
truth (a patch reported applied has its marker in all its files, one reported not applied in none),
a failed call left everything as it was, and the next run of the same command, then a revert,
finish the job with no temp file left behind. Each test prints how many faults it injected.

The demo tree gets every call k of every scenario; copies of a real SGLang and a real vLLM tree get
every k too, for fewer errnos. The patch engine remembers its codemod results in-process
(toolkit/engine/transform.py), so the runs after the first pay for the I/O under test, not for libcst.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import signal
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from toolkit import patch_registry
from toolkit.engine import patching as engine, fs
from toolkit.errors import PatchError
from toolkit.engine.sources import load_source
from toolkit.engine.state import StateDir

from tests.toolkit import demo_patches
from tests.toolkit.test_release_cache import index  # noqa: F401 - a fixture
from tests.harness import by_id

QUICK = os.environ.get("TOOLKIT_QUICK") == "1"  # scripts/test.sh --quick (tests/conftest.py): fewer faulted calls

ERRNOS = (errno.EPERM, errno.EACCES, errno.ENOSPC, errno.EIO, errno.EROFS)
# The primitives of toolkit.engine.fs; its compositions (stage, atomic_write, ...) call these.
PRIMITIVES = ("read_bytes", "read_file", "lstat", "listdir", "mkdir", "unlink", "rmdir", "replace", "mkstemp",
              "write_all", "fsync", "close", "fsync_dir", "open_fd", "flock", "pread", "overwrite", "fchmod")


class Injector:
    """Counts calls to toolkit.engine.fs; fails call ``fail_at`` (and every later one when sticky), or
    SIGKILLs the process at call ``kill_at``, or sends it SIGINT (a real signal, as Ctrl-C does) just
    before call ``interrupt_at`` or just after it returned (``interrupt_after``: the rename done, its
    caller not yet told), or runs ``plant`` (a link put in the tree, as another process would) just before
    call ``plant_at``."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail_at: int | None = None
        self.kill_at: int | None = None
        self.interrupt_at: int | None = None
        self.interrupt_after = False
        self.errno = errno.EIO
        self.sticky = False
        self.injected = 0
        self.plant_at: int | None = None
        self.plant: Callable[[], None] = lambda: None

    @contextlib.contextmanager
    def active(self, fail_at: int | None = None, kill_at: int | None = None, err: int = errno.EIO,
               sticky: bool = False, interrupt_at: int | None = None, interrupt_after: bool = False,
               plant_at: int | None = None, plant: Callable[[], None] | None = None):
        self.calls, self.fail_at, self.kill_at, self.errno, self.sticky = 0, fail_at, kill_at, err, sticky
        self.interrupt_at, self.interrupt_after = interrupt_at, interrupt_after
        self.plant_at, self.plant = plant_at, plant or (lambda: None)
        saved = {name: getattr(fs, name) for name in PRIMITIVES}
        for name, real in saved.items():
            setattr(fs, name, self._wrap(name, real))
        try:
            yield self
        finally:
            for name, real in saved.items():
                setattr(fs, name, real)

    def _wrap(self, name: str, real: Callable) -> Callable:
        def call(*args, **kwargs):
            self.calls += 1
            if self.kill_at == self.calls:
                os.kill(os.getpid(), signal.SIGKILL)
            if self.plant_at == self.calls:
                self.plant()  # with os and shutil, not through toolkit.engine.fs: not counted
            if self.interrupt_at == self.calls and self.interrupt_after:
                try:
                    return real(*args, **kwargs)
                finally:  # also when the call raised (a file not found is an answer too)
                    os.kill(os.getpid(), signal.SIGINT)
            if self.interrupt_at == self.calls:
                os.kill(os.getpid(), signal.SIGINT)
            if self.fail_at is not None and (self.calls == self.fail_at or (self.sticky and self.calls > self.fail_at)):
                self.injected += 1
                if name == "close":
                    real(*args, **kwargs)  # Linux frees the descriptor even when close reports an error
                path = next((str(a) for a in args if isinstance(a, (str, Path))), None)
                raise OSError(self.errno, os.strerror(self.errno), path)
            if name in ("fsync", "fsync_dir"):
                return None  # durability across power loss is not what a process-level fault tests; fsync is slow
            return real(*args, **kwargs)

        return call


@pytest.fixture
def fault_dir(tmp_path):
    """Thousands of tiny trees are copied and deleted: on tmpfs when there is one, so that a busy disk
    (a CI run beside this one) does not turn metadata waits into minutes."""
    shm = Path("/dev/shm")
    if not (shm.is_dir() and os.access(shm, os.W_OK)):
        yield tmp_path
        return
    root = Path(tempfile.mkdtemp(prefix="toolkit-faults-", dir=shm))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@dataclass
class Scenario:
    name: str
    setup: Callable  # brings a fresh tree to the start state, without faults
    op: Callable  # the command under test


def _digests(installed, relpaths) -> dict[str, str | None]:
    out = {}
    for relpath in relpaths:
        path = Path(installed.package_dir) / relpath
        out[relpath] = hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None
    return out


def _states(installed) -> dict[str, str]:
    return {row.patch_id: row.state for row in engine.status(installed)}


def _assert_status_true(installed, patches) -> dict[str, str]:
    """Every patch's state is true of its files; returns the states (``_states``, from the same one read)."""
    rows = engine.status(installed)
    for row in rows:
        assert row.state in ("applied", "not applied", "partial"), (row.patch_id, row.state, row.detail)
        patch = next((p for p in patches if p.id == row.patch_id), None)
        if patch is None:  # a patch that does not declare this version: never touched
            assert row.state == "not applied", row
            continue
        marked = [f"# toolkit:{patch.id}" in (Path(installed.package_dir) / e.relpath).read_text()
                  for e in patch.files_for(installed.version)]
        if row.state == "applied":
            assert all(marked), (row.patch_id, "applied but a file lacks its marker")
        if row.state == "not applied":
            assert not any(marked), (row.patch_id, "not applied but a file carries its marker")
    return {row.patch_id: row.state for row in rows}


def _temps(site: Path) -> list[Path]:
    return [p for p in site.rglob("*") if p.name.endswith(fs.TEMP_SUFFIX)]


class Harness:
    """One scenario on one tree: a template in the start state, the states before and after."""

    def __init__(self, root: Path, make_site: Callable[[Path], Path], scenario: Scenario, patches) -> None:
        self.root, self.scenario, self.patches = root, scenario, patches
        self.pristine_site = make_site(root / "pristine")
        version = self._installed(self.pristine_site).version
        self.relpaths = sorted({e.relpath for p in patches for e in p.files_for(version)})
        self.template = root / "template"
        shutil.copytree(self.pristine_site, self.template, symlinks=True)
        scenario.setup(self._installed(self.template))
        self.pristine = _digests(self._installed(self.pristine_site), self.relpaths)
        self.before = _digests(self._installed(self.template), self.relpaths)
        self.states_before = _states(self._installed(self.template))
        done = self.fresh("clean-run")
        scenario.op(done)
        self.after = _digests(done, self.relpaths)
        self.states_after = _states(done)
        self.backups_before = _backups(self._installed(self.template))
        self.backups_after = _backups(done)
        assert self.after != self.before, "the scenario must change files"
        self.count = 0

    @staticmethod
    def _installed(site: Path):
        return load_source(site).as_installed()

    def fresh(self, name: str):
        site = self.root / name
        shutil.rmtree(site, ignore_errors=True)
        shutil.copytree(self.template, site, symlinks=True)
        return self._installed(site)

    def count_calls(self, injector: Injector) -> int:
        installed = self.fresh("count")
        with injector.active():
            self.scenario.op(installed)
        return injector.calls

    def check_after_fault(self, installed, raised: bool, all_or_nothing: bool) -> None:
        now = _digests(installed, self.relpaths)
        for relpath in self.relpaths:  # whole: original or fully patched, nothing in between
            assert now[relpath] in (self.before[relpath], self.after[relpath]), relpath
        states = _assert_status_true(installed, self.patches)
        if not raised:
            assert now == self.after and states == self.states_after
        elif all_or_nothing:
            assert now == self.before and states == self.states_before
        else:
            for pid, state in states.items():
                assert state in (self.states_before[pid], self.states_after[pid], "partial"), (pid, state)

    def finish(self, installed) -> None:
        self.scenario.op(installed)
        assert _digests(installed, self.relpaths) == self.after
        assert _states(installed) == self.states_after
        engine.revert(installed)
        assert _digests(installed, self.relpaths) == self.pristine
        assert set(_states(installed).values()) == {"not applied"}
        state = StateDir(installed.site_dir, installed.engine)
        assert not state.manifest_path.exists() and not state.backup_root.exists()
        assert _temps(installed.site_dir) == []

    def fail_every_call(self, injector: Injector, errnos, modes=(False, True), step: int = 1,
                        one_errno_a_call: bool = False) -> None:
        """Each call fails with each of ``errnos``, or (``one_errno_a_call``) with one of them, taken in turn:
        the patch engine handles every errno but ELOOP/ENOTDIR/EWOULDBLOCK alike (the demo tree runs them all
        at every call), so a real tree's run gives each call one."""
        total = self.count_calls(injector)
        assert total > 5
        for k in sorted({*range(1, total + 1, step), total}):
            for err in (errnos[k % len(errnos)],) if one_errno_a_call else errnos:
                for sticky in modes:
                    installed = self.fresh("case")
                    before = injector.injected
                    with injector.active(fail_at=k, err=err, sticky=sticky):
                        try:
                            self.scenario.op(installed)
                            raised = False
                        except PatchError as exc:
                            raised = True
                            assert "\n" not in str(exc)
                    self.count += injector.injected - before
                    context = f"{self.scenario.name}: call {k}/{total}, {errno.errorcode[err]}, sticky={sticky}"
                    try:
                        self.check_after_fault(installed, raised, all_or_nothing=not sticky)
                        self.finish(installed)
                    except AssertionError as exc:
                        raise AssertionError(f"{context}: {exc}") from exc

    def kill_at_every_call(self, injector: Injector, step: int = 1) -> None:
        total = self.count_calls(injector)
        for k in range(1, total + 1, step):
            installed = self.fresh("case")
            pid = os.fork()
            if pid == 0:  # the child: run the command and die by SIGKILL at call k
                code = 0
                try:
                    with injector.active(kill_at=k):
                        self.scenario.op(installed)
                except BaseException:
                    code = 1
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"call {k}: {status}"
            self.count += 1
            try:
                self.check_after_fault(installed, raised=True, all_or_nothing=False)
                self.finish(installed)
            except AssertionError as exc:
                raise AssertionError(f"{self.scenario.name}: SIGKILL at call {k}/{total}: {exc}") from exc


    def interrupt_at_every_call(self, injector: Injector, step: int = 1) -> None:
        """Ctrl-C before and after every call: each run ends as it began or as it should, never between
        (no partial state, no file without its backup), with status true and the next runs finishing."""
        total = self.count_calls(injector)
        for k in range(1, total + 1, step):
            for after in (False, True):
                installed = self.fresh("case")
                pid = os.fork()
                if pid == 0:  # the child: the command, with SIGINT at call k
                    code = 0
                    try:
                        with injector.active(interrupt_at=k, interrupt_after=after):
                            self.scenario.op(installed)
                    except KeyboardInterrupt:
                        code = 130
                    except BaseException:  # noqa: BLE001 - any other ending is a failure of the test
                        code = 1
                    os._exit(code)
                _, status = os.waitpid(pid, 0)
                where = f"{self.scenario.name}: SIGINT {'after' if after else 'before'} call {k}/{total}"
                assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 130, f"{where}: {status}"
                self.count += 1
                try:
                    self.check_after_interrupt(installed)
                    self.finish(installed)
                except AssertionError as exc:
                    raise AssertionError(f"{where}: {exc}") from exc

    def plant_at_every_call(self, injector: Injector, step: int = 1) -> None:
        """A link planted just before every call k (a file the command writes, its folder, or the folder's
        ``__pycache__``, each made a link to a copy of itself outside site-packages): the command either
        finishes (it wrote nothing there after k) or raises one sentence naming the link; either way the
        link is still a link and nothing was written through it. Once the link is replaced by a copy of
        what it points to (what the sentence says to do), every file is whole, status is true, and the
        next run, then a revert, finish the job."""
        total = self.count_calls(injector)
        written = [r for r in self.relpaths if self.before[r] != self.after[r]][0]
        for k in sorted({*range(1, total + 1, step), total}):
            for kind in PLANTED:
                installed = self.fresh("case")
                link = Path(installed.package_dir) / PLANTED[kind](written)
                elsewhere = self.root / "elsewhere"
                shutil.rmtree(elsewhere, ignore_errors=True)
                seen: dict[str, tuple] = {}

                def plant() -> None:
                    _plant_link(link, elsewhere)
                    seen.update(_outside(elsewhere))

                where = f"{self.scenario.name}: {kind} link planted before call {k}/{total}"
                message = ""
                with injector.active(plant_at=k, plant=plant):
                    try:
                        self.scenario.op(installed)
                    except PatchError as exc:
                        message = str(exc)
                self.count += 1
                try:
                    assert os.path.islink(link), "the link is gone"
                    assert _outside(elsewhere) == seen, "written through the link"
                    assert not [p for p in elsewhere.rglob("*") if p.name.endswith(fs.TEMP_SUFFIX)], "temp left outside"
                    if message:
                        assert f"{link} " in message and "symbolic link" in message and "\n" not in message, message
                    _copy_in_place_of(link)
                    self.check_after_fault(installed, bool(message), all_or_nothing=kind != "folder")
                    self.finish(installed)
                except AssertionError as exc:
                    raise AssertionError(f"{where}: {exc}") from exc

    def check_after_interrupt(self, installed) -> None:
        now = _digests(installed, self.relpaths)
        assert now in (self.before, self.after), "files neither as they were nor as they should be"
        ended = "before" if now == self.before else "after"
        assert _states(installed) == (self.states_before if ended == "before" else self.states_after)
        assert _backups(installed) == (self.backups_before if ended == "before" else self.backups_after), \
            f"backups differ from a run that ended {ended}"
        assert _temps(installed.site_dir) == []


# what a link is planted at, from the file the command writes (its relpath in the package)
PLANTED: dict[str, Callable[[str], str]] = {
    "file": lambda relpath: relpath,
    "folder": lambda relpath: os.path.dirname(relpath),
    "__pycache__": lambda relpath: os.path.join(os.path.dirname(relpath), "__pycache__"),
}


def _plant_link(path: Path, elsewhere: Path) -> None:
    """``path`` moved to ``elsewhere`` and a link to it left in its place; a missing ``__pycache__`` is
    made first, with bytecode of every module of its folder (what a deletion through the link would take)."""
    if path.name == "__pycache__" and not os.path.lexists(path):
        path.mkdir()
        for source in path.parent.glob("*.py"):
            (path / f"{source.stem}.cpython-312.pyc").write_bytes(b"bytecode")
    elsewhere.mkdir(parents=True, exist_ok=True)
    outside = elsewhere / path.name
    shutil.move(path, outside)
    path.symlink_to(outside, target_is_directory=outside.is_dir())


def _outside(elsewhere: Path) -> dict[str, bytes | None]:
    """What the link's target holds (temp files aside: a run's own, removed by it)."""
    return {str(p.relative_to(elsewhere)): None if p.is_dir() else p.read_bytes()
            for p in sorted(elsewhere.rglob("*")) if not p.name.endswith(fs.TEMP_SUFFIX)}


def _copy_in_place_of(link: Path) -> None:
    """The fix the refusal names: the link replaced by a copy of what it points to."""
    target = Path(os.readlink(link))
    link.unlink()
    if target.is_dir():
        shutil.copytree(target, link, symlinks=True)
    else:
        shutil.copy2(target, link)


def _backups(installed) -> dict[str, str]:
    root = StateDir(installed.site_dir, installed.engine).backup_root
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()} if root.is_dir() else {}


def _report(capsys, what: str, count: int) -> None:
    with capsys.disabled():
        print(f"\n{what}: {count} faults injected, every file whole, status true, every next run finished")


# --------------------------------------------------------------------------------------------------
# the demo tree: every scenario, every call, every errno, once and for good, and SIGKILL at every call
# (scripts/test.sh --quick: every third call; CI: every call)

QUICK_STEP = 3 if QUICK else 1

def _second_distribution(installed) -> None:
    """Patched, then a stale dist-info beside the install (issue 49; what `pip install` of another
    distribution of the package leaves): another version's METADATA, a RECORD whose hashes do not
    match the files. The harness reads each copy with load_source, which must still name the owner."""
    site = installed.site_dir
    demo_patches.write_record(site)
    by_id.apply(installed, ["demo", "second"])
    stale = site / "sglang-0.5.8.dist-info"  # sorts before the owner's: first met by a name-order reader
    stale.mkdir()
    (stale / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.8\n")
    rows = [row.split(",") for row in (site / "sglang-0.5.9.dist-info" / "RECORD").read_text().split()]
    (stale / "RECORD").write_text("".join(f"{path},sha256={'A' * 43},{size}\n" for path, _, size in rows))


DEMO_SCENARIOS = [
    Scenario("apply demo", lambda e: None, lambda e: by_id.apply(e, ["demo"])),
    Scenario("apply second over demo", lambda e: by_id.apply(e, ["demo"]), lambda e: by_id.apply(e, ["second"])),
    Scenario("revert demo, keep second", lambda e: by_id.apply(e, ["demo", "second"]),
             lambda e: by_id.revert(e, ["demo"])),
    Scenario("revert all", lambda e: by_id.apply(e, ["demo", "second"]), lambda e: engine.revert(e)),
    # the command that once dropped the backups of patched files when a second distribution was there
    Scenario("second distribution, revert --force", _second_distribution, lambda e: engine.revert(e, force=True)),
]


@pytest.fixture
def demo_registry(monkeypatch):
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [demo_patches.DEMO, demo_patches.SECOND])
    return [demo_patches.DEMO, demo_patches.SECOND]


@pytest.mark.parametrize("scenario", DEMO_SCENARIOS, ids=lambda s: s.name)
def test_every_failing_call_on_the_demo_tree(scenario, demo_registry, fault_dir, capsys):
    harness = Harness(fault_dir, demo_patches.make_engine_tree, scenario, demo_registry)
    harness.fail_every_call(Injector(), ERRNOS, step=QUICK_STEP)
    _report(capsys, f"demo tree, {scenario.name}", harness.count)
    assert harness.count >= 100 // QUICK_STEP


@pytest.mark.parametrize("scenario", DEMO_SCENARIOS, ids=lambda s: s.name)
def test_a_link_planted_at_every_call_on_the_demo_tree(scenario, demo_registry, fault_dir, capsys):
    harness = Harness(fault_dir, demo_patches.make_engine_tree, scenario, demo_registry)
    harness.plant_at_every_call(Injector(), step=QUICK_STEP)
    _report(capsys, f"demo tree, link planted, {scenario.name}", harness.count)
    assert harness.count >= 3 * 20 // QUICK_STEP


def _site_with_record(site: Path) -> Path:
    demo_patches.make_engine_tree(site)
    demo_patches.write_record(site)
    return site


def _no_download(distribution, version):
    raise AssertionError("the backups verify: repair must not fetch the release")


def test_every_failing_call_and_sigkill_during_repair(demo_registry, fault_dir, capsys):
    from toolkit.engine.repair import repair

    scenario = Scenario("repair", lambda e: by_id.apply(e, ["demo", "second"]), lambda e: repair(e, _no_download))
    harness = Harness(fault_dir, _site_with_record, scenario, demo_registry)
    harness.fail_every_call(Injector(), ERRNOS, step=QUICK_STEP)
    harness.kill_at_every_call(Injector(), step=QUICK_STEP)
    harness.plant_at_every_call(Injector(), step=QUICK_STEP)
    _report(capsys, "demo tree, repair", harness.count)


@pytest.mark.parametrize("scenario", DEMO_SCENARIOS, ids=lambda s: s.name)
def test_sigkill_at_every_call_on_the_demo_tree(scenario, demo_registry, fault_dir, capsys):
    harness = Harness(fault_dir, demo_patches.make_engine_tree, scenario, demo_registry)
    harness.kill_at_every_call(Injector(), step=QUICK_STEP)
    _report(capsys, f"demo tree, SIGKILL, {scenario.name}", harness.count)


@pytest.mark.parametrize("scenario", DEMO_SCENARIOS, ids=lambda s: s.name)
def test_sigint_at_every_call_on_the_demo_tree(scenario, demo_registry, fault_dir, capsys):
    harness = Harness(fault_dir, demo_patches.make_engine_tree, scenario, demo_registry)
    harness.interrupt_at_every_call(Injector(), step=QUICK_STEP)
    _report(capsys, f"demo tree, SIGINT, {scenario.name}", harness.count)
    assert harness.count >= 40 // QUICK_STEP


def test_sigint_at_every_call_during_repair(demo_registry, fault_dir, capsys):
    from toolkit.engine.repair import repair

    scenario = Scenario("repair", lambda e: by_id.apply(e, ["demo", "second"]), lambda e: repair(e, _no_download))
    harness = Harness(fault_dir, _site_with_record, scenario, demo_registry)
    harness.interrupt_at_every_call(Injector(), step=QUICK_STEP)
    _report(capsys, "demo tree, SIGINT, repair", harness.count)


def _lose_manifest(installed) -> None:
    by_id.apply(installed, ["demo", "second"])
    StateDir(installed.site_dir, installed.engine).manifest_path.unlink()


@pytest.mark.parametrize("command", ["revert", "revert demo", "apply", "apply second"])
def test_a_lost_manifest_stops_every_command_and_keeps_the_backups(command, demo_registry, fault_dir):
    """Patched files and no manifest: the command says so and fails; no backup goes, no file changes;
    SIGINT at any call of it changes nothing either; repair then restores the release from the backups."""
    from toolkit.engine.repair import repair

    verb, _, patch_id = command.partition(" ")
    call = by_id.revert if verb == "revert" else by_id.apply
    op = lambda e: call(e, [patch_id] if patch_id else None)  # noqa: E731
    site = _site_with_record(fault_dir / "pristine")
    release = {r: (site / "sglang" / r).read_bytes() for r in ("srt/serving.py", "srt/protocol.py")}
    installed = load_source(site).as_installed()
    _lose_manifest(installed)
    files, backups = _digests(installed, release), _backups(installed)
    assert backups, "the apply wrote backups"
    injector = Injector()
    with pytest.raises(PatchError, match="manifest is missing"), injector.active():
        op(installed)
    for k in range(1, injector.calls + 1):
        pid = os.fork()
        if pid == 0:
            with contextlib.suppress(BaseException), injector.active(interrupt_at=k):
                op(installed)
            os._exit(0)
        os.waitpid(pid, 0)
    assert _digests(installed, release) == files and _backups(installed) == backups
    assert set(_states(installed).values()) == {"patched, no manifest"}
    repair(installed, _no_download)
    assert {r: (site / "sglang" / r).read_bytes() for r in release} == release
    assert set(_states(installed).values()) == {"not applied"} and _backups(installed) == {}


# --------------------------------------------------------------------------------------------------
# a symbolic link at an engine file or at the package directory: refused before anything is written


def _link_out(site: Path, relpath: str) -> None:
    """Move ``sglang/<relpath>`` (a file or a folder, as it is now) out of site-packages, leave a link."""
    inside = site / "sglang" / relpath if relpath else site / "sglang"
    outside = site.parent / "outside" / inside.name
    outside.parent.mkdir(exist_ok=True)
    shutil.move(inside, outside)
    inside.symlink_to(outside, target_is_directory=outside.is_dir())


def _tree(root: Path) -> dict[str, tuple]:
    """Every path under ``root``, links not followed: a link's target, a file's mode and bytes (the lock
    file's bytes aside: repair writes its pid there while it holds it)."""
    seen: dict[str, tuple] = {}
    for path in sorted(root.rglob("*")):
        info = path.lstat()
        if os.path.islink(path):
            seen[str(path)] = ("link", os.readlink(path))
        elif os.path.isdir(path):
            seen[str(path)] = ("dir", info.st_mode)
        else:
            seen[str(path)] = ("file", info.st_mode, b"" if path.name == "lock" else path.read_bytes())
    return seen


def _repair(installed) -> None:
    from toolkit.engine.repair import repair

    repair(installed, _no_download)


LINKED = {  # the link, what is applied before it is made, the command
    "file, apply": ("srt/protocol.py", [], lambda e: by_id.apply(e, ["demo"])),
    "file, revert": ("srt/protocol.py", ["demo", "second"], lambda e: engine.revert(e)),
    "file, repair": ("srt/protocol.py", ["demo", "second"], _repair),
    "package dir, apply": ("", [], lambda e: engine.apply(e)),
    "package dir, revert": ("", ["demo"], lambda e: by_id.revert(e, ["demo"])),
}


@pytest.mark.parametrize("name", LINKED)
def test_a_symlinked_file_or_package_dir_is_refused_under_every_fault(name, demo_registry, fault_dir, capsys):
    """Every call of the refused command fails (each errno, once and for good), is SIGKILLed, or gets
    Ctrl-C before or after it: nothing is written (the lock of a repair aside, which takes it before
    it knows), the link stays a link, `status` says what it said, and the next run refuses in a sentence."""
    relpath, applied, op = LINKED[name]
    site = _site_with_record(fault_dir / "site")
    installed = load_source(site).as_installed()
    if applied:
        by_id.apply(installed, applied)
    _link_out(site, relpath)
    before, states = _tree(fault_dir), _states(installed)
    refused = "is a symbolic link"

    def unchanged(context: str) -> None:
        assert _tree(fault_dir) == before, f"{name}: {context}: something was written"
        assert _states(installed) == states, f"{name}: {context}: status changed"
        with pytest.raises(PatchError, match=refused):
            op(installed)

    injector = Injector()
    with pytest.raises(PatchError, match=refused), injector.active():
        op(installed)
    total, count = injector.calls, 0
    assert total >= 1
    for k in range(1, total + 1):
        for err in ERRNOS:
            for sticky in (False, True):
                with pytest.raises(PatchError) as caught, injector.active(fail_at=k, err=err, sticky=sticky):
                    op(installed)
                assert "\n" not in str(caught.value)
                count += 1
                unchanged(f"call {k}/{total} failed with {errno.errorcode[err]}, sticky={sticky}")
        for interrupt in ("kill", "before", "after"):
            pid = os.fork()
            if pid == 0:  # the child: the command, killed or interrupted at call k
                code = 0
                try:
                    if interrupt == "kill":
                        with injector.active(kill_at=k):
                            op(installed)
                    else:
                        with injector.active(interrupt_at=k, interrupt_after=interrupt == "after"):
                            op(installed)
                except KeyboardInterrupt:
                    code = 130
                except PatchError:
                    code = 3
                except BaseException:  # noqa: BLE001 - any other ending is a failure of the test
                    code = 1
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            where = f"{interrupt} at call {k}/{total}"
            if interrupt == "kill":
                assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, f"{name}: {where}: {status}"
            else:
                assert os.WIFEXITED(status) and os.WEXITSTATUS(status) in (130, 3), f"{name}: {where}: {status}"
            count += 1
            unchanged(where)
    assert (site / "sglang" / relpath).is_symlink() if relpath else (site / "sglang").is_symlink()
    _report(capsys, f"demo tree, symlinked {name}", count)


# --------------------------------------------------------------------------------------------------
# copies of real engine trees (only the dist-info and the files the patches edit)


def _slim_site(name: str, package: str) -> Callable[[Path], Path]:
    from tests.harness.fixtures import ensure_source_tree

    dist, version = name.rsplit("-", 1)
    source = ensure_source_tree(dist, version)
    relpaths = sorted({e.relpath for p in patch_registry.catalog(package).patches if p.supports(version)
                       for e in p.files_for(version)})

    def make(site: Path) -> Path:
        for entry in source.glob("*.dist-info"):
            shutil.copytree(entry, site / entry.name)
        for relpath in relpaths:
            target = site / package / relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / package / relpath, target)
        return site

    return make


REAL = [("sglang-0.5.23", "sglang"), ("vllm-0.33.0", "vllm")]


# Thousands of faulted runs over real sources: ~2.7 minutes for the two cases alone on this 2-core machine
# (past 10 when each run read the patch registry many times); room for workers sharing the cores.
@pytest.mark.timeout(2400)
@pytest.mark.parametrize("name,package", REAL)
def test_every_failing_call_on_a_real_tree(name, package, fault_dir, capsys, monkeypatch):
    # The registry read once, as a command reads it at its edge: each of the thousands of runs here is
    # a command, and the faults are in the file system, not in reading entry points (~13 ms a read).
    known = patch_registry.registry()
    monkeypatch.setattr(patch_registry, "registry", lambda: list(known))
    version = name.rsplit("-", 1)[1]
    patches = [p for p in patch_registry.catalog(package).patches if p.supports(version)]
    count = 0
    sample = 14 if QUICK else 1  # --quick: every 14th call (and the last); CI: every call
    for scenario in (Scenario("apply all", lambda e: None, lambda e: engine.apply(e)),
                     Scenario("revert all", lambda e: engine.apply(e), lambda e: engine.revert(e))):
        harness = Harness(fault_dir / scenario.name.replace(" ", "-"), _slim_site(name, package), scenario, patches)
        harness.fail_every_call(Injector(), (errno.ENOSPC, errno.EROFS), step=sample, one_errno_a_call=True)
        harness.kill_at_every_call(Injector(), step=3 * sample)
        harness.interrupt_at_every_call(Injector(), step=4 * sample)
        harness.plant_at_every_call(Injector(), step=12 * sample)  # three links each: file, folder, __pycache__
        count += harness.count
    _report(capsys, f"{name} copy", count)


# --------------------------------------------------------------------------------------------------
# umask 0: what matrix, repair and the codemod cache write is never more open than 0755 / 0644


def test_umask_0_runs_of_matrix_repair_and_the_codemod_cache(
        index, demo_registry, tmp_path, monkeypatch, capsys):  # noqa: F811 - the fixture
    """Under umask 0, `mkdir` makes 0777 folders and pip 0666 files: a release cache, a wheel or a codemod
    cache (pickles) anyone could edit. `toolkit matrix`, a `repair` that downloads the release's wheel, and
    an apply that fills the codemod cache, all under umask 0: every folder they make is 0755, every file
    0644 at most, and the engine's files keep their release modes."""
    from tests.toolkit.test_cache_trust import assert_never_more_open
    from toolkit import cli
    from toolkit.kit import _releases as releases
    from toolkit.engine import transform, transform_cache
    from toolkit.engine.repair import repair

    codemods = tmp_path / "codemods" / "nested"
    monkeypatch.setenv(transform_cache.CACHE_ENV, str(codemods))
    roots = transform_cache._roots()  # the demo transformers counted as this distribution's own code
    monkeypatch.setattr(transform_cache, "_roots", lambda: [*roots, Path(demo_patches.__file__).resolve().parent])
    transform.forget()
    (index / "sglang-0.5.9-py3-none-any.whl").chmod(0o666)  # as a download under umask 0 leaves it
    site = _site_with_record(tmp_path / "site")
    installed = load_source(site).as_installed()
    release_modes = {p: stat.S_IMODE(p.lstat().st_mode) for p in (site / "sglang").rglob("*")}
    old = os.umask(0)
    try:
        assert cli.main(["matrix", "sglang", "--release", "sglang==0.5.9", "--json"]) == 0
        by_id.apply(installed, ["demo", "second"])  # the codemods' results kept on disk
        shutil.rmtree(StateDir(site, "sglang").backup_root)  # repair must fetch the release's wheel
        result = repair(installed)
    finally:
        os.umask(old)
    capsys.readouterr()
    assert set(result.restored.values()) == {"release"}, result.restored
    assert list(codemods.iterdir()), "the codemod cache was written"
    for root in (releases.cache_dir(), tmp_path / "codemods"):
        assert_never_more_open(root)
        assert {stat.S_IMODE(p.lstat().st_mode) for p in [root, *root.rglob("*")] if p.is_dir()} == {0o755}, root
    assert list((releases.cache_dir() / "wheels").glob("*.whl")), "repair's wheel is cached"
    assert {p: stat.S_IMODE(p.lstat().st_mode) for p in (site / "sglang").rglob("*")} == release_modes
