"""The SGLang runs of one release group, shared by the token-ids, tito and superlinear release tests.

Importing SGLang is most of a serving driver's time (11-15 s of 16-19 s), so every case that can run
in one interpreter does: for each release group (``SGLANG_PROVED``), on one private copy of the venv's
``sglang`` (``private_sglang.py``: the shared venv is never written), ``group_driver.py`` runs once per
patch state, four runs where the two test files ran five processes:

1. token-ids alone: the token-ids cases, then its vanilla cases under ``TOOLKIT_RETURN_TOKEN_IDS=1``;
   then token-ids is reverted (its files checked byte-identical to the release's);
2. tito alone: the tito cases;
3. token-ids and tito together: the tito cases (and, on the releases test_splice.py runs on, the
   prefix-splice cases); then token-ids is reverted alone, leaving tito's files byte-identical to
   tito applied alone;
4. both reverted, the upstream baseline of both test files: their files byte-identical to the
   release's; it runs after the patched code ran from the same copy, so a stale module a revert left
   would show as a patch's behaviour, which the baseline tests rule out.

Then, on the same copy (its files byte-identical to the release's again), the superlinear backend's
release drives that tests/patches/sglang/superlinear/test_releases.py asserts (``superlinear_runs``):
on 0.5.9 and 0.5.10 the stock control (0.5.9 only), ``superlinear-backend`` applied, a drive,
reverted (its files' sha256 before and after); from 0.5.11 a drive of the stock copy with the plugin
selected (``TOOLKIT_ATTENTION_BACKEND=superlinear``). Each drive gets the environment its own
subprocess had: no ``TOOLKIT_*`` variable of the tests, plus ``sglang_env()``. A failure there is
kept for test_releases.py alone; the serving runs stand.

The runs are forks of one interpreter (tests/harness/forks.py) that has imported the drivers'
third-party libraries once (torch, transformers, ...: most of an SGLang import); each fork imports
SGLang itself from the copy's files as they are in that patch state. A drive went from 16-19 s to
2-3 s (0.5.23, quiet); the group's four from ~88 s of CPU to ~19 s. That interpreter serves every
group over the same libraries (the same base venv and the same transformers: tests/harness/workers.py
``sglang_libraries``; six sets for the fifteen groups), each fork with its own group's copy on its path in place of the
server's, so the ~17 s of importing them is paid once a set instead of once a group; the scheduler
gives one worker all the groups of a set (tests/harness/workers.py ``sglang_libraries``).

Computed once per process (the first test that asks), kept for the other files; the scheduler gives
the four files' tests of one set of libraries to the same worker (tests/harness/workers.py
``MERGED_BY_RELEASE``).
"""

from __future__ import annotations

import atexit
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from tests.harness.fixtures import (SGLANG_GROUP_RELEASES, SGLANG_PROVED, ensure_engine_python, ensure_tiny_model,
                                    sglang_env, toolkit_cache_dir)
from tests.harness.forks import ForkServer
from tests.harness.workers import sglang_libraries
from tests.patches.sglang.token_ids.private_sglang import PrivateSglang, private_sglang, sha256s

GROUP_DRIVER = Path(__file__).with_name("group_driver.py")
SUPERLINEAR_DRIVER = Path(__file__).parent / "superlinear" / "release_driver.py"
SPLICE_RELEASES = ("0.5.9", "0.5.23")  # tests/patches/sglang/tito/test_splice.py


@dataclass
class GroupRuns:
    version: str
    sha_before: dict[str, str]  # the files token-ids edits (tito edits them too), as released
    # 1. token-ids alone
    token_ids_status: set[str]
    token_ids_sha: dict[str, str]
    token_ids: dict  # the token-ids driver's cases
    token_ids_env: dict  # its vanilla cases under TOOLKIT_RETURN_TOKEN_IDS=1
    token_ids_status_reverted: set[str]
    token_ids_sha_reverted: dict[str, str]
    # 2. tito alone
    tito_sha: dict[str, str]
    tito: dict
    # 3. both
    both_states: dict[str, set[str]]
    both: dict  # the tito driver's cases
    # 4. both reverted
    unpatched_token_ids: dict
    unpatched_tito: dict
    sha_reverted: dict[str, str]
    states_reverted: dict[str, set[str]]
    splice: dict | None = field(default=None)  # the splice driver's cases, patched with both (SPLICE_RELEASES)
    # then: superlinear_runs' result, or what it raised (tests/patches/sglang/superlinear/test_releases.py)
    superlinear: dict | BaseException | None = field(default=None)


_RUNS: dict[str, GroupRuns | BaseException] = {}


def drive_env() -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k != "TOOLKIT_RETURN_TOKEN_IDS"}
    environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return environ


def group_runs(version: str, tmp_path_factory) -> GroupRuns:
    """The runs of ``version``'s group, computed at the first call in this process (a failure too:
    the second file's tests get the same error at once instead of running it all again)."""
    if version not in _RUNS:
        try:
            _RUNS[version] = _run(version, tmp_path_factory)
        except BaseException as exc:  # noqa: BLE001 - kept and raised again for every caller
            _RUNS[version] = exc
        _close_when_its_libraries_are_done(version)
    got = _RUNS[version]
    if isinstance(got, BaseException):
        raise got
    return got


def _run(version: str, tmp_path_factory) -> GroupRuns:
    copy = private_sglang(ensure_engine_python(f"sglang-{version}"), tmp_path_factory.mktemp(f"sglang-{version}"))
    python, forks = copy.python, GroupForks(_libraries_fork_server(version, copy), copy)
    runs = _run_states(version, python, ensure_tiny_model(), forks)
    if version not in (*SGLANG_PROVED["superlinear-backend"], *SGLANG_PROVED["superlinear-plugin"]):
        return runs
    try:
        runs.superlinear = superlinear_runs(version, python, lambda mode, **env: _superlinear_fork(forks, mode, env))
    except Exception as exc:  # noqa: BLE001 - test_releases.py's failure, raised there; the serving runs stand
        runs.superlinear = exc
    return runs


_FORK_SERVERS: dict[str, ForkServer] = {}  # sglang_libraries() -> this process's fork server of those libraries


def _libraries_fork_server(version: str, copy: PrivateSglang) -> ForkServer:
    """The fork server of ``version``'s libraries in this process: started by the first group over them (with
    ``copy``'s interpreter of them) and kept for the next; one of other libraries is closed first (a worker
    runs the groups of one set together), so at most one is held. A server that died is started again."""
    libraries = sglang_libraries(version)
    forks = _FORK_SERVERS.get(libraries)
    if forks is not None and forks.process is not None:
        return forks
    _close_fork_servers()
    forks = ForkServer(copy.libs_python, env=drive_env(), key=f"sglang-libs-{libraries}", cache_dir=toolkit_cache_dir())
    forks.start()
    atexit.register(forks.close)  # the last one, at the worker's end
    _FORK_SERVERS[libraries] = forks
    return forks


def _close_fork_servers() -> None:
    while _FORK_SERVERS:
        _FORK_SERVERS.popitem()[1].close()


def _close_when_its_libraries_are_done(version: str) -> None:
    """Once every group over ``version``'s libraries has run in this process, their fork server goes (so its
    CPU time is counted with these tests, not at the worker's exit)."""
    libraries = sglang_libraries(version)
    if all(release in _RUNS for release in SGLANG_GROUP_RELEASES if sglang_libraries(release) == libraries):
        _close_fork_servers()


@dataclass
class GroupForks:
    """A libraries' fork server running one group's drivers: each fork imports from the group's copy."""

    server: ForkServer
    copy: PrivateSglang

    @property
    def env(self) -> dict[str, str]:
        return self.server.env

    def run(self, argv, **options):
        # what the group's own wrapper interpreter would put on the path, before the caller's PYTHONPATH
        inherited = self.server.env.get("PYTHONPATH")
        pythonpath = self.copy.pythonpath + (f":{inherited}" if inherited else "")
        run = self.server.run(argv, pythonpath=pythonpath, **options)
        served = run.result.get("sglang_file") if isinstance(run.result, dict) else None
        # group_driver.py says which sglang it imported: this group's copy, never the server's first group's
        assert served is None or served.startswith(self.copy.pythonpath.split(":", 1)[0] + "/"), (served, pythonpath)
        return run


def _superlinear_fork(forks: GroupForks, mode: str, env: dict[str, str]) -> dict:
    """release_driver.py in a fork, in the environment its own subprocess has (test_releases.py ``run``):
    none of the tests' ``TOOLKIT_*`` variables, ``sglang_env()`` (its ``PYTHONPATH``, the sgl_kernel shim,
    is on the private interpreter's path already: private_install), then ``env``."""
    unset = [name for name in forks.env if name.startswith("TOOLKIT_")]
    extra = {k: v for k, v in sglang_env().items() if k != "PYTHONPATH"}
    return forks.run([str(SUPERLINEAR_DRIVER), mode], env={**extra, **env}, unset=unset, timeout=300).ok()


def superlinear_runs(version: str, python: str, run: Callable[..., dict]) -> dict:
    """release_driver.py's runs on ``version`` (``run(mode, **env)`` runs it on ``python``'s sglang), for
    test_releases.py to assert: ``{"plugin": result}`` from 0.5.11 (the stock sglang, the plugin
    selected); before that ``{"stock": the control's result (the first release) or None, "before":
    shas, "patch": result, "after": shas}``, ``superlinear-backend`` applied for the ``patch`` run and
    reverted."""
    from toolkit import apply_patch, revert_patch
    from toolkit.patches.sglang.superlinear_backend.patch import PATCH

    if version in SGLANG_PROVED["superlinear-plugin"]:
        return {"plugin": run("plugin", TOOLKIT_ATTENTION_BACKEND="superlinear")}
    got: dict = {"before": sha256s(python, PATCH)}
    # the control: stock SGLang knows no such backend
    got["stock"] = run("patch") if version == SGLANG_PROVED["superlinear-backend"][0] else None
    assert apply_patch(engine="sglang", patches=["superlinear-backend"], python=python)
    try:
        got["patch"] = run("patch")
    finally:
        assert revert_patch(engine="sglang", patches=["superlinear-backend"], python=python)
    got["after"] = sha256s(python, PATCH)
    return got


def _run_states(version: str, python: str, model: str, forks: GroupForks) -> GroupRuns:
    from toolkit import apply_patch, patch_status, revert_patch

    def drive(*parts: str) -> dict:  # a fork of the libraries' interpreter: they are imported once
        return forks.run([str(GROUP_DRIVER), model, *parts], timeout=900).ok()

    def states() -> dict[str, set[str]]:
        rows = patch_status(engine="sglang", python=python)
        return {patch: {row.state for row in rows if row.patch_id == patch} for patch in ("token-ids", "tito")}  # only ours

    sha_before = sha256s(python)
    # 1. token-ids alone
    assert apply_patch(engine="sglang", patches=["token-ids"], python=python) is True
    try:
        token_ids_status = states()["token-ids"]
        token_ids_sha = sha256s(python)
        token_ids = drive("token-ids-server-wide")["token-ids-server-wide"]
    finally:
        assert revert_patch(engine="sglang", patches=["token-ids"], python=python) is True
    token_ids_status_reverted = states()["token-ids"]
    token_ids_sha_reverted = sha256s(python)
    # 2. tito alone, 3. both
    assert apply_patch(engine="sglang", patches=["tito"], python=python) is True
    try:
        tito_sha = sha256s(python)
        tito = drive("tito")["tito"]
        assert apply_patch(engine="sglang", patches=["token-ids"], python=python) is True
        both_states = states()
        both = drive("tito", *(["splice"] if version in SPLICE_RELEASES else []))
        # each reverts alone: token-ids goes, tito stays, byte-identical to tito applied alone
        assert revert_patch(engine="sglang", patches=["token-ids"], python=python) is True
        assert sha256s(python) == tito_sha
    finally:
        revert_patch(engine="sglang", patches=["tito", "token-ids"], python=python)
    # 4. both reverted: the baseline
    unpatched = drive("token-ids", "tito")
    return GroupRuns(
        version=version, sha_before=sha_before,
        token_ids_status=token_ids_status, token_ids_sha=token_ids_sha, token_ids_env=token_ids.pop("server_wide"),
        token_ids=token_ids, token_ids_status_reverted=token_ids_status_reverted,
        token_ids_sha_reverted=token_ids_sha_reverted,
        tito_sha=tito_sha, tito=tito, both_states=both_states, both=both["tito"],
        unpatched_token_ids=unpatched["token-ids"], unpatched_tito=unpatched["tito"],
        sha_reverted=sha256s(python), states_reverted=states(), splice=both.get("splice"),
    )
