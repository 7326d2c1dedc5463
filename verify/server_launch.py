"""What an engine server is started with: its command line, environment and working directory.

The command runs the engine's OpenAI entry point under the given interpreter with the CPU defaults of
shared/ENGINES.md, where a flag the caller passes replaces its default. The environment points TMPDIR,
HF_HOME and the engines' cache roots inside the server's temporary directory and turns the hub off;
the working directory is an empty folder there. One exception: a ``TORCHINDUCTOR_CACHE_DIR`` the caller
sets is kept, as torch itself would use it (torch.compile's kernels, compiled once for every server).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["VLLM_CPU_ARGS", "SGLANG_CPU_ARGS", "SGLANG_CUDA_GRAPH_FLAG_BEFORE", "server_command", "server_env",
           "server_workdir"]

# --enforce-eager: start-up without torch.compile's C++ builds (less CPU on a 2-core machine), and
# forward hooks fire; pass --no-enforce-eager for the compiled path.
VLLM_CPU_ARGS = (
    "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "8", "--seed", "0",
    "--kv-cache-memory-bytes", "67108864", "--enforce-eager",
)
# --sleep-on-idle: SGLang's scheduler otherwise polls its sockets in a busy loop and holds a whole CPU
# for as long as the server lives, requests or not (20 CPU-s in 20 idle seconds, 0.4 with the flag,
# 0.5.9 and 0.5.23 alike); it then waits on the sockets instead, and a request still wakes it at once.
SGLANG_CPU_ARGS = (
    "--device", "cpu", "--attention-backend", "torch_native", "--sampling-backend", "pytorch",
    "--skip-server-warmup", "--sleep-on-idle", "--mem-fraction-static", "0.05", "--max-total-tokens", "4096",
    "--dtype", "float32", "--random-seed", "0",
)
# Before this version SGLang needs --disable-cuda-graph on CPU (0.5.23 deprecates the flag).
SGLANG_CUDA_GRAPH_FLAG_BEFORE = "0.5.23"

# The server's own folders in its temp dir. None is named like an importable package: a directory
# "triton" on sys.path would shadow the real one as a namespace package.
_TMP_SUBDIRS = ("tmp", "hf-home", "xdg-cache", "vllm-cache", "sglang-cache", "triton-cache", "inductor-cache")


def server_command(engine: str, python: str, model: str, host: str, port: int, version: str,
                   server_args: Sequence[str], *, cpu: bool) -> list[str]:
    """The command line of ``engine`` (``version`` installed for ``python``) serving ``model``."""
    if engine == "vllm":
        defaults = list(VLLM_CPU_ARGS) if cpu else []
        return [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
                "--host", host, "--port", str(port), *_merge_args(defaults, server_args)]
    defaults = list(SGLANG_CPU_ARGS) if cpu else []
    if cpu and _release_before(version, SGLANG_CUDA_GRAPH_FLAG_BEFORE):
        defaults.append("--disable-cuda-graph")
    return [python, "-m", "sglang.launch_server", "--model-path", model,
            "--host", host, "--port", str(port), *_merge_args(defaults, server_args)]


def server_env(engine: str, tmp_dir: Path, extra_env: Mapping[str, str], *, cpu: bool) -> dict[str, str]:
    """This process's environment for a server in ``tmp_dir`` (its folders made there), then ``extra_env``."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    for sub in _TMP_SUBDIRS:
        (tmp_dir / sub).mkdir(exist_ok=True)
    env.update({
        "TMPDIR": str(tmp_dir / "tmp"),
        "HF_HOME": str(tmp_dir / "hf-home"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "XDG_CACHE_HOME": str(tmp_dir / "xdg-cache"),
        "TRITON_CACHE_DIR": str(tmp_dir / "triton-cache"),
        # torch.compile's cache, where the caller keeps one: what the engines compile with inductor at start-up
        # or on the first requests (C++ on CPU, ~4 s a kernel) is compiled once instead of by every server. Its
        # entries are keyed by torch, the compiler and the source, and torch locks it for concurrent processes.
        "TORCHINDUCTOR_CACHE_DIR": os.environ.get("TORCHINDUCTOR_CACHE_DIR") or str(tmp_dir / "inductor-cache"),
        "VLLM_CACHE_ROOT": str(tmp_dir / "vllm-cache"),
        "VLLM_CONFIG_ROOT": str(tmp_dir / "vllm-cache"),
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "SGLANG_CACHE_DIR": str(tmp_dir / "sglang-cache"),
        "OUTLINES_CACHE_DIR": str(tmp_dir / "xdg-cache" / "outlines"),
        "PYTHONUNBUFFERED": "1",
    })
    if cpu and engine == "vllm":
        env["VLLM_TARGET_DEVICE"] = "cpu"
    if cpu and engine == "sglang":
        env["SGLANG_USE_CPU_ENGINE"] = "1"
    env.update(extra_env)
    return env


def server_workdir(tmp_dir: Path) -> Path:
    """An empty cwd: under `python -m` it is sys.path[0], so nothing may sit in it."""
    work = tmp_dir / "cwd"
    work.mkdir(exist_ok=True)
    return work


def _release_before(version: str, release: str) -> bool:
    """Whether ``version`` is older than ``release`` (PEP 440; a version that is not PEP 440 is not)."""
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) < Version(release)
    except InvalidVersion:
        return False


def _merge_args(defaults: Sequence[str], given: Sequence[str]) -> list[str]:
    """Defaults whose flag the caller did not give (as --flag, --flag=v or --no-flag), then the caller's."""
    given_flags = {a.split("=", 1)[0] for a in given if a.startswith("--")}
    given_flags |= {"--" + f[len("--no-"):] for f in given_flags if f.startswith("--no-")}
    merged: list[str] = []
    i = 0
    while i < len(defaults):
        flag = defaults[i]
        values = []
        i += 1
        while i < len(defaults) and not defaults[i].startswith("--"):
            values.append(defaults[i])
            i += 1
        if flag not in given_flags:
            merged += [flag, *values]
    return merged + list(given)
