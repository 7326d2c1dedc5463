"""Bad input is never a traceback: an interpreter that is not one, an engine version that is not PEP 440,
a wheel or METADATA that is garbage, a corrupt manifest, a read-only state dir, a failing disk. Each is
one sentence on stderr and exit 1 or 2, or an error object on stdout with --json; a hypothesis test
feeds the CLI garbage arguments and manifests."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import os
import shutil
import tempfile
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit import api, cli
from toolkit.engine import fs
from toolkit.engine.sources import load_source

from tests.toolkit import demo_patches

CORRUPT_MANIFESTS = {
    "truncated": b'{"format": 1, "toolkit_version": "0.1.0", "engine": "sgl',
    "empty": b"",
    "random bytes": bytes(range(256)) * 3,
    "a list": b"[]",
    "files as a list": json.dumps({"format": 1, "toolkit_version": "0.1.0", "engine": "sglang",
                                   "distribution": "sglang", "engine_version": "0.5.9", "state": "applied",
                                   "patches": ["demo"], "files": ["srt/serving.py"]}).encode(),
    "patches null": json.dumps({"format": 1, "toolkit_version": "0.1.0", "engine": "sglang",
                                "distribution": "sglang", "engine_version": "0.5.9", "state": "applied",
                                "patches": None, "files": {}}).encode(),
    "a path out of the package": json.dumps({
        "format": 1, "toolkit_version": "0.1.0", "engine": "sglang", "distribution": "sglang",
        "engine_version": "0.5.9", "state": "applied", "patches": ["demo"],
        "files": {"../../etc/passwd": {"before": "0", "after": "1", "patches": ["demo"]}}}).encode(),
}


@pytest.fixture(autouse=True)
def demo_registry(monkeypatch):
    monkeypatch.setattr("toolkit.patch_registry.registry", lambda: [demo_patches.DEMO, demo_patches.SECOND])


def use_tree(monkeypatch, site: Path) -> None:
    """The CLI's engine discovery sees ``site`` as this interpreter's install."""
    monkeypatch.setattr(api, "find_engines", lambda python=None: [load_source(site).as_installed()])


def run(capsys, *argv: str) -> tuple[int, str, str]:
    try:
        code = cli.main(list(argv))
    except SystemExit as exc:  # argparse's own usage errors
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def one_sentence(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("toolkit: ")
    return lines[0]


@pytest.mark.parametrize("python", ["/bin/true", "/etc/passwd", "/dev"])
def test_python_that_is_not_an_interpreter(python, capsys):
    code, _, err = run(capsys, "status", "--python", python)
    assert code == 2 and python in one_sentence(err)
    code, out, _ = run(capsys, "apply-patch", "--python", python, "--json")
    payload = json.loads(out)
    assert code == 2 and payload["ok"] is False and payload["kind"] == "usage" and python in payload["error"]


def test_engine_version_that_is_not_pep_440(tmp_path, monkeypatch, capsys):
    site = demo_patches.make_engine_tree(tmp_path / "site", version="0.5.15.custom-build")
    use_tree(monkeypatch, site)
    code, out, _ = run(capsys, "status", "--json")
    assert code == 0 and {(r["state"], r["supported"]) for r in json.loads(out)["patches"]} == {("not applied", False)}
    code, _, err = run(capsys, "apply-patch")
    assert code == 1 and "no patch supports sglang 0.5.15.custom-build" in one_sentence(err)
    code, _, err = run(capsys, "apply-patch", "--patch", "demo")
    assert code == 1 and "--allow-unknown-version" in one_sentence(err)
    code, out, _ = run(capsys, "check", "--source", str(site), "--json")
    assert code == 0 and json.loads(out)["version"] == "0.5.15.custom-build"
    code, _, _ = run(capsys, "apply-patch", "--patch", "demo", "--allow-unknown-version")
    assert code == 0
    # a patched tree: the codemod recognises its own marker and check says so
    code, out, _ = run(capsys, "check", "--source", str(site), "--json")
    assert code == 1 and "already carries its marker" in json.dumps(json.loads(out)["patches"])


def test_a_version_picking_codemod_on_a_non_pep_440_version_is_a_sentence():
    from toolkit.codemod import AnchoredTransformer, FileEdit, Patch
    from toolkit.errors import PatchError
    from toolkit.engine.transform import run_transformers

    class ByVersion(AnchoredTransformer):
        def __init__(self, context):
            super().__init__(context)
            self.new = context.version.major > 0

    patch = Patch("by-version", "sglang", ">=0,<1", (FileEdit("x.py", (ByVersion,)),), "picks by version")
    with pytest.raises(PatchError, match="not a PEP 440 version"):
        run_transformers(patch, patch.files[0], "x = 1\n", "0.5.15.custom-build")


def _wheel(path: Path, members: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def test_check_source_on_garbage(tmp_path, capsys):
    garbage = tmp_path / "sglang-0.5.9-py3-none-any.whl"
    garbage.write_bytes(os.urandom(2048))
    no_version = _wheel(tmp_path / "a.whl", {"sglang-0.5.9.dist-info/METADATA": b"Name: sglang\n"})
    binary_meta = _wheel(tmp_path / "b.whl", {"sglang-0.5.9.dist-info/METADATA": b"\xff\xfe\x00garbage"})
    no_meta = _wheel(tmp_path / "c.whl", {"sglang/x.py": b"x = 1\n"})
    not_a_wheel = tmp_path / "notes.txt"
    not_a_wheel.write_text("hello")
    for source in (garbage, no_version, binary_meta, no_meta, not_a_wheel, tmp_path / "missing.whl"):
        code, _, err = run(capsys, "check", "--source", str(source))
        assert code == 2, (source, err)
        one_sentence(err)
        code, out, _ = run(capsys, "check", "--source", str(source), "--json")
        assert code == 2 and json.loads(out)["ok"] is False

    site = demo_patches.make_engine_tree(tmp_path / "site")
    (site / "sglang/srt/serving.py").write_bytes(b"# \xff\xfe not utf-8\n")
    code, out, _ = run(capsys, "check", "--source", str(site), "--json")
    payload = json.loads(out)
    assert code == 1 and any("not UTF-8" in e for p in payload["patches"] for e in p["errors"])
    code, out, _ = run(capsys, "check", "--source", str(site))
    assert code == 1 and "would NOT apply" in out


@pytest.mark.parametrize("kind", sorted(CORRUPT_MANIFESTS))
def test_corrupt_manifest(kind, tmp_path, monkeypatch, capsys):
    site = demo_patches.make_engine_tree(tmp_path / "site")
    use_tree(monkeypatch, site)
    assert run(capsys, "apply-patch", "--patch", "demo")[0] == 0
    manifest = site / ".toolkit-state/sglang/manifest.json"
    manifest.write_bytes(CORRUPT_MANIFESTS[kind])
    # status reads the truth from the files
    code, out, _ = run(capsys, "status", "--json")
    rows = {r["patch_id"]: r for r in json.loads(out)["patches"]}
    assert code == 1 and rows["demo"]["state"] == "patched, no manifest" and "repair" in rows["demo"]["detail"]
    assert rows["second"]["state"] == "not applied"
    patched = {p: p.read_bytes() for p in (site / "sglang/srt").glob("*.py")}
    for argv in (["apply-patch"], ["apply-patch", "--patch", "second"], ["revert"], ["revert", "--force"]):
        code, _, err = run(capsys, *argv)
        assert code == 1 and "repair" in one_sentence(err), (argv, err)
        code, out, _ = run(capsys, *argv, "--json")
        assert code == 1 and json.loads(out)["ok"] is False
    assert {p: p.read_bytes() for p in (site / "sglang/srt").glob("*.py")} == patched  # nothing written


def test_deleted_manifest_while_patched_is_never_patched_twice(tmp_path, monkeypatch, capsys):
    """Issue case 4: with the manifest gone, status says so (not "not applied"), and an apply refuses
    instead of patching the patched files again and overwriting the pristine backups with them."""
    site = demo_patches.make_engine_tree(tmp_path / "site")
    use_tree(monkeypatch, site)
    run(capsys, "apply-patch", "--patch", "demo")
    backups = {p: p.read_bytes() for p in (site / ".toolkit-state/sglang/backups").rglob("*.py")}
    (site / ".toolkit-state/sglang/manifest.json").unlink()
    code, out, _ = run(capsys, "status")
    assert code == 1 and "patched, no manifest" in out
    serving = (site / "sglang/srt/serving.py").read_bytes()
    code, _, err = run(capsys, "apply-patch", "--patch", "demo")
    assert code == 1 and "carry the marker of patch demo but the toolkit manifest is missing" in one_sentence(err)
    code, _, err = run(capsys, "revert")  # issue 29: revert said "nothing to revert", exit 0, and dropped the backups
    assert code == 1 and "cannot revert them safely" in one_sentence(err)
    assert (site / "sglang/srt/serving.py").read_bytes() == serving
    assert {p: p.read_bytes() for p in (site / ".toolkit-state/sglang/backups").rglob("*.py")} == backups


def test_read_only_state_dir(tmp_path, monkeypatch, capsys):
    """Root ignores permission bits, so the read-only file system is simulated at the seam."""
    site = demo_patches.make_engine_tree(tmp_path / "site")
    use_tree(monkeypatch, site)
    original = {p: p.read_bytes() for p in (site / "sglang/srt").glob("*.py")}

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(args[0]))

    monkeypatch.setattr(fs, "mkdir", read_only)
    code, _, err = run(capsys, "apply-patch")
    sentence = one_sentence(err)
    assert code == 1 and ".toolkit-state" in sentence and "EROFS" in sentence
    code, out, _ = run(capsys, "apply-patch", "--json")
    assert code == 1 and "Read-only file system" in json.loads(out)["error"]
    assert run(capsys, "status")[0] == 0  # status writes nothing: it still works
    assert {p: p.read_bytes() for p in (site / "sglang/srt").glob("*.py")} == original


@pytest.mark.parametrize("err", [errno.EPERM, errno.EACCES, errno.ENOSPC, errno.EIO, errno.EROFS])
def test_a_rename_that_fails_mid_apply(err, tmp_path, monkeypatch, capsys):
    """Issue case 1 (chattr +i on a target, a full disk): the second rename fails; the first file is put
    back, the manifest stays true, the API raises PatchError, the CLI says one sentence or JSON."""
    from toolkit import apply_patch, PatchError

    site = demo_patches.make_engine_tree(tmp_path / "site")
    use_tree(monkeypatch, site)
    original = {p: p.read_bytes() for p in (site / "sglang/srt").glob("*.py")}
    real_replace = fs.replace

    def replace(src, dst):
        if str(dst).endswith("serving.py"):
            raise OSError(err, os.strerror(err), str(dst))
        return real_replace(src, dst)

    monkeypatch.setattr(fs, "replace", replace)
    with pytest.raises(PatchError, match=f"serving.py: {os.strerror(err)}.*{errno.errorcode[err]}.*put back"):
        apply_patch(patches=["demo"])
    code, _, stderr = run(capsys, "apply-patch", "--patch", "demo")
    assert code == 1 and "serving.py" in one_sentence(stderr)
    code, out, _ = run(capsys, "apply-patch", "--patch", "demo", "--json")
    assert code == 1 and json.loads(out)["kind"] == "error" and "serving.py" in json.loads(out)["error"]
    assert {p: p.read_bytes() for p in (site / "sglang/srt").glob("*.py")} == original
    monkeypatch.setattr(fs, "replace", real_replace)
    code, out, _ = run(capsys, "status", "--json")
    assert code == 0 and {r["state"] for r in json.loads(out)["patches"]} == {"not applied"}


def test_usage_errors_with_json_are_json(capsys):
    code, out, err = run(capsys, "apply-patch", "--no-such-flag", "--json")
    assert code == 2 and json.loads(out)["kind"] == "usage" and err == ""
    code, out, _ = run(capsys, "apply-patch", "--lock-timeout", "nan", "--json")
    assert code == 2 and "seconds" in json.loads(out)["error"]


# --------------------------------------------------------------------------------------------------
# garbage in, exit 0 / 1 / 2 out, never a traceback

WORDS = ["list", "apply-patch", "revert", "status", "check", "sglang", "vllm", "--patch", "demo", "second",
         "token-ids", "nope", "--force", "--dry-run", "--diff", "--json", "--allow-unknown-version",
         "--lock-timeout", "0", "-1", "nan", "--source", "/", "/etc/passwd", "--python", "/bin/true", "",
         "\x00", "é", "--", "-"]


@settings(max_examples=120)
@given(argv=st.lists(st.one_of(st.sampled_from(WORDS), st.text(max_size=12)), max_size=7),
       manifest=st.one_of(st.none(), st.sampled_from(sorted(CORRUPT_MANIFESTS.values())), st.binary(max_size=300)))
def test_garbage_arguments_and_manifests(argv, manifest):
    root = Path(tempfile.mkdtemp(prefix="toolkit-garbage-"))
    saved = api.find_engines
    try:
        site = demo_patches.make_engine_tree(root / "site")
        if manifest is not None:
            (site / ".toolkit-state/sglang").mkdir(parents=True)
            (site / ".toolkit-state/sglang/manifest.json").write_bytes(manifest)
        api.find_engines = lambda python=None: [load_source(site).as_installed()]
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = cli.main(argv)
            except SystemExit as exc:
                code = exc.code
        assert code in (0, 1, 2), (argv, code)
        text = out.getvalue() + err.getvalue()
        assert "Traceback" not in text and "internal error" not in text, (argv, manifest, text)
    finally:
        api.find_engines = saved
        shutil.rmtree(root, ignore_errors=True)
