"""Patches from any two packages that edit one function: ordered by ``after=`` or refused at plan time.

The order patches apply in is declared, never taken from how the environment lists entry points: a
plan that would apply two patches editing the same function with no ``after=`` between them stops
with one sentence naming both and the function, before anything is written. Patches that edit
different functions of one file need no order. Our own patches declare theirs (the same order the
installed entry-point table gave them before, so files patched by an earlier release keep their bytes).
"""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import libcst as cst
import libcst.matchers as m
import pytest

from tests.toolkit import demo_patches
from toolkit import patch_registry
from toolkit.engine import patching as engine
from toolkit.engine import status as states
from toolkit.codemod import AnchoredTransformer, FileEdit, Patch
from toolkit.errors import PatchError
from toolkit.engine.overlap import edited_functions
from toolkit.errors import RegistryError
from toolkit.engine.sources import load_source
from tests.harness import by_id


class LogHandle(AnchoredTransformer):
    """A second package's edit of ``Serving.handle``, the function the demo patch wraps too."""

    ANCHORS = {"Serving.handle": "the request handler"}

    @m.leave(m.FunctionDef(name=m.Name("handle")))
    def log(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        self.hit("Serving.handle")
        line = self.marked_statement("print('handled', request)")
        return updated_node.with_changes(body=updated_node.body.with_changes(body=[line, *updated_node.body.body]))


FOREIGN = Patch(id="log-handle", engine="sglang", versions=">=0.5.9,<=0.5.23",
                files=(FileEdit("srt/serving.py", (LogHandle,)),), summary="another package's edit of handle")


def _installed(tmp_path: Path):
    return load_source(demo_patches.make_engine_tree(tmp_path / "site")).as_installed()


def _bytes(installed) -> dict[str, str]:
    root = Path(installed.package_dir)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*.py"))}


def _use(monkeypatch, *patches: Patch) -> None:
    monkeypatch.setattr(patch_registry, "registry", lambda: list(patches))


def test_two_patches_editing_one_function_without_after_are_refused_naming_both(tmp_path, monkeypatch):
    _use(monkeypatch, demo_patches.DEMO, FOREIGN)
    installed = _installed(tmp_path)
    before = _bytes(installed)
    with pytest.raises(PatchError) as refused:
        engine.apply(installed)
    message = str(refused.value)
    assert "patches demo and log-handle both edit Serving.handle in srt/serving.py" in message
    assert "after=" in message and "nothing was written" in message and "\n" not in message
    assert _bytes(installed) == before
    assert not (installed.site_dir / ".toolkit-state" / "sglang" / "manifest.json").exists()
    # one of them alone is fine, and then adding the other is refused the same way
    by_id.apply(installed, ["demo"])
    with pytest.raises(PatchError, match="both edit Serving.handle"):
        by_id.apply(installed, ["log-handle"])
    engine.revert(installed)
    assert _bytes(installed) == before


def test_after_orders_them_whatever_the_registry_order(tmp_path, monkeypatch):
    ordered = dataclasses.replace(FOREIGN, after=("demo",))
    results = []
    for registry in ((demo_patches.DEMO, ordered), (ordered, demo_patches.DEMO)):
        _use(monkeypatch, *registry)
        assert patch_registry.catalog("sglang").ids == ["demo", "log-handle"]
        installed = _installed(tmp_path / str(len(results)))
        engine.apply(installed)
        serving = (Path(installed.package_dir) / "srt" / "serving.py").read_text()
        # log-handle applies on demo's result: its line comes first in the function
        assert serving.index("print('handled', request)") < serving.index("request = request  # toolkit:demo")
        results.append(_bytes(installed))
        by_id.revert(installed, ["demo"])  # reverting the first keeps the second as if alone
        assert "# toolkit:demo" not in (Path(installed.package_dir) / "srt" / "serving.py").read_text()
    assert results[0] == results[1]


def test_patches_editing_other_functions_of_one_file_need_no_order(tmp_path, monkeypatch):
    _use(monkeypatch, demo_patches.DEMO, demo_patches.SECOND)  # handle and other, both in srt/serving.py
    installed = _installed(tmp_path)
    engine.apply(installed)
    assert [row.state for row in engine.status(installed)] == [states.APPLIED, states.APPLIED]


def test_a_circle_of_after_is_one_sentence(monkeypatch):
    first = dataclasses.replace(demo_patches.DEMO, after=("log-handle",))
    second = dataclasses.replace(FOREIGN, after=("demo",))
    with pytest.raises(RegistryError) as refused:
        patch_registry.ordered([first, second])
    assert str(refused.value) == ("sglang patches order each other in a circle with after= (demo after log-handle, "
                                  "log-handle after demo): no order applies them; drop one of those after= entries")


def test_after_naming_a_patch_not_installed_is_no_constraint():
    lonely = dataclasses.replace(FOREIGN, after=("not-installed",))
    assert [p.id for p in patch_registry.ordered([lonely, demo_patches.DEMO])] == ["log-handle", "demo"]


def test_after_must_be_a_sequence_of_ids():
    with pytest.raises(TypeError, match="after must be a sequence of patch ids"):
        dataclasses.replace(FOREIGN, after="demo")


def test_edited_functions_reads_code_not_comments():
    before = "class A:\n    def f(self):\n        return 1\n    def g(self):\n        def inner():\n            pass\n"
    commented = before.replace("return 1", "return 1  # toolkit:x")
    assert edited_functions(before, commented) == frozenset()
    changed = before.replace("pass", "return 2")
    assert edited_functions(before, changed) == {"A.g", "A.g.inner"}
    assert edited_functions(before, before + "def added():\n    pass\n") == {"added"}


def test_our_own_patches_that_share_a_function_declare_their_order():
    """Where two of ours edit one function on some release (measured on the real trees: SGLang
    token-ids and tito share ChatCompletionResponse._serialize, vLLM tito and responses-stream the
    Responses generators), the later one says so, in the order the installed entry-point table gave them
    (alphabetical by entry name), so installs patched before keep their bytes."""
    known = {(p.engine, p.id): p for p in patch_registry.registry()}
    assert known[("sglang", "token-ids")].after == ("tito",)
    assert known[("vllm", "tito")].after == ("responses-stream",)
    assert patch_registry.catalog("sglang").ids[-2:] == ["tito", "token-ids"]
    assert patch_registry.catalog("vllm").ids == ["patch-sweep", "responses-stream", "tito"]
