"""Test helpers for patch authors: golden snippets and conformance on real engine releases.

For a patch in this repository or in another distribution (registered through the ``toolkit.patches``
entry-point group), in its own test suite::

    from toolkit.testing import assert_codemod, assert_conforms

    def test_the_codemod():
        assert_codemod(MyTransformer, '''
            def handler(request):
                return serve(request)
        ''', '''
            def handler(request):
                log(request)  # toolkit:example
                return serve(request)
        ''', patch_id="example")

    def test_the_patch_conforms():
        assert_conforms("my-patch")  # every known release its versions declare

* :func:`assert_codemod` runs one transformer on a snippet (both snippets are dedented) and fails with
  a unified diff unless the result is the expected text, and with the anchors named unless every
  anchor was found as declared.
* :func:`conformance_problems` / :func:`assert_conforms`: for every release (default: every known
  release of the patch's engine inside ``patch.versions``, see :mod:`toolkit.releases`), on a copy of
  the release's files, through the patch engine as ``toolkit apply-patch`` runs it: every anchor is
  found, the apply edits every file declared for the release (``Patch.files_for``), each result
  compiles and carries the marker, ``status`` says applied, a second apply changes nothing, the revert
  is byte-identical and leaves no state; and
  composed with each other patch of the engine supporting the release (``others``) that edits one of
  its files (patches with no file in common are planned and written apart), both orders give
  the same bytes, reverting one leaves the other as if applied alone, reverting all is byte-identical.
  The releases' files come from the cache (``$TOOLKIT_CACHE_DIR``), downloaded once when missing.

Imports no pytest (scripts use it); failures are ``AssertionError`` and a refusal of the patch engine
is a problem string, never a raise out of :func:`conformance_problems`.
"""

from __future__ import annotations

import difflib
import hashlib
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Sequence, Union

from toolkit import patch_registry
from toolkit.engine import patching, status
from toolkit.kit import _releases  # the module; `releases` is a parameter below
from toolkit.engine.check import file_outcomes
from toolkit.kit._declare import Patch, PatchContext, TransformerRef
from toolkit.engine.discovery import InstalledEngine
from toolkit.errors import PatchError
from toolkit.patch_registry import Catalog
from toolkit.engine.sources import SourceTree

__all__ = ["assert_codemod", "assert_conforms", "conformance_problems", "golden_problems", "anchor_problems",
           "composition_problems", "copy_files", "digests"]

PatchRef = Union[Patch, str]


# ---- one transformer on a snippet


def _snippet(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n").rstrip() + "\n"


def assert_codemod(transformer: TransformerRef, before: str, after: str, *, engine: str = "vllm",
                   engine_version: str = "0.33.0", relpath: str = "module.py", patch_id: str = "example") -> None:
    """Run ``transformer`` (an ``AnchoredTransformer`` class, or ``"module:Class"``) on ``before``;
    AssertionError unless the result is ``after`` (a unified diff says where not) and every anchor was
    found as declared (the anchors that were not are named)."""
    import libcst as cst

    from toolkit.kit._declare import FileEdit

    (make,) = FileEdit(relpath, [transformer]).load_transformers()
    instance = make(PatchContext(patch_id, engine, engine_version, relpath))
    try:
        result = cst.parse_module(_snippet(before)).visit(instance).code
    except cst.ParserSyntaxError as exc:
        raise AssertionError(f"the `before` snippet does not parse: {exc}") from None
    name = type(instance).__name__
    missed = [f"{a.name} ({a.description}): {a.problem}" for a in instance.anchor_report() if not a.ok]
    wanted = _snippet(after)
    got = result.rstrip() + "\n"
    if got != wanted:
        diff = "".join(difflib.unified_diff(wanted.splitlines(True), got.splitlines(True), "expected", name))
        missing = f"\nanchors not found as declared: {'; '.join(missed)}" if missed else ""
        raise AssertionError(f"{name} on the snippet did not give the expected text:\n{diff}{missing}")
    if missed:
        raise AssertionError(f"{name}: anchors not found as declared: {'; '.join(missed)}")


# ---- a patch on a copy of a release's files


def copy_files(tree: SourceTree, relpaths: Sequence[str], root: Path) -> InstalledEngine:
    """A site under ``root`` with just these files of ``tree``'s package: the engine reads nothing else."""
    package_dir = root / "site" / tree.package
    for relpath in relpaths:
        data = tree.read(relpath)
        if data is None:
            raise FileNotFoundError(f"{tree.distribution} {tree.version} has no {relpath}")
        target = package_dir / relpath
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return InstalledEngine(tree.engine, tree.distribution, tree.version, str(package_dir), sys.executable)


def digests(installed: InstalledEngine, relpaths: Sequence[str]) -> dict[str, str]:
    """``{relpath: sha256}`` of these files of ``installed``: compare before and after a revert."""
    return {r: hashlib.sha256((Path(installed.package_dir) / r).read_bytes()).hexdigest() for r in relpaths}


def anchor_problems(tree: SourceTree, patch: Patch) -> tuple[int, int, list[str]]:
    """(anchors found, anchors reported, problems) of ``patch``'s codemods on ``tree``'s files: an
    anchor not found as declared is ``"file: anchor (problem)"``, a file that cannot be read or
    transformed ``"file: why"``."""
    found = total = 0
    problems: list[str] = []
    for edit, outcome, error in file_outcomes(tree, patch):
        if outcome is None:
            problems.append(error)
            continue
        if not outcome.anchors:
            problems.append(f"{edit.relpath}: no anchor reported")
        for _, anchor in outcome.anchors:
            total += 1
            found += anchor.ok
            if not anchor.ok:
                problems.append(f"{edit.relpath}: {anchor.name} ({anchor.problem})")
    return found, total, problems


def golden_problems(tree: SourceTree, patch: Patch, root: Path, *, allow_unknown_version: bool = False,
                    catalog: Catalog | None = None) -> list[str]:
    """What goes wrong applying ``patch`` to a copy of its files of ``tree`` under ``root``, and
    reverting it; ``[]`` when nothing does. A refusal of the patch engine is one problem, not a raise.
    ``catalog``: the engine's patches (default: the registry's)."""
    relpaths = [edit.relpath for edit in patch.files_for(tree.version)]
    installed = copy_files(tree, relpaths, root)
    before = digests(installed, relpaths)
    problems: list[str] = []
    options: dict[str, Any] = {"catalog": catalog}
    try:
        result = patching.apply(installed, [patch], allow_unknown_version=allow_unknown_version, **options)
    except PatchError as exc:
        return [f"apply refused: {exc}"]
    if sorted(result.changed_files) != sorted(relpaths):
        problems.append(f"apply changed {sorted(result.changed_files)}, declared {sorted(relpaths)}")
    for relpath in relpaths:
        text = (Path(installed.package_dir) / relpath).read_text()
        try:
            compile(text, relpath, "exec")
        except SyntaxError as exc:
            problems.append(f"{relpath}: patched result does not compile: {exc}")
        if f"# toolkit:{patch.id}" not in text:
            problems.append(f"{relpath}: no `# toolkit:{patch.id}` marker")
    states = [s.state for s in patching.status(installed, **options) if s.patch_id == patch.id]
    if states != [status.APPLIED]:
        problems.append(f"status after apply is {states}, not applied")
    if patching.apply(installed, [patch], allow_unknown_version=allow_unknown_version, **options).changed_files:
        problems.append("a second apply changed files (must have nothing to do)")
    patching.revert(installed, [patch], **options)
    changed = sorted(r for r, digest in digests(installed, relpaths).items() if digest != before[r])
    if changed:
        problems.append(f"revert is not byte-identical: {changed}")
    left = sorted(p.name for p in (installed.site_dir / ".toolkit-state" / tree.engine).iterdir())
    if left != ["lock"]:
        problems.append(f"revert left {left} in the state directory (want only the lock)")
    if {s.state for s in patching.status(installed, **options) if s.patch_id == patch.id} != {status.NOT_APPLIED}:
        problems.append("status after revert is not `not applied`")
    return problems


def composition_problems(tree: SourceTree, patch: Patch, other: Patch, root: Path, *,
                         catalog: Catalog | None = None) -> list[str]:
    """``patch`` with ``other`` on a copy of both's files of ``tree`` under ``root``: applied in either
    order the same bytes, each reverted leaves the other as if applied alone, all reverted the release's
    bytes. A refusal (two patches editing one function with no ``after=`` between them) is a problem."""
    relpaths = sorted({edit.relpath for p in (patch, other) for edit in p.files_for(tree.version)})
    installed = copy_files(tree, relpaths, root)
    opts: dict[str, Any] = {"catalog": catalog}
    a, b = patch.id, other.id
    problems: list[str] = []

    def state() -> dict[str, str]:
        return digests(installed, relpaths)

    def expect(what: str, want: dict[str, str]) -> None:
        changed = sorted(r for r, digest in state().items() if digest != want[r])
        if changed:
            problems.append(f"with {b}: {what} ({', '.join(changed)} differ)")

    try:
        pristine = state()
        patching.apply(installed, [patch], allow_unknown_version=True, **opts)
        alone_a = state()
        patching.revert(installed, **opts)
        patching.apply(installed, [other], allow_unknown_version=True, **opts)
        alone_b = state()
        patching.revert(installed, **opts)
        patching.apply(installed, [patch], allow_unknown_version=True, **opts)
        patching.apply(installed, [other], allow_unknown_version=True, **opts)
        a_then_b = state()
        for relpath in relpaths:
            try:
                compile((Path(installed.package_dir) / relpath).read_text(), relpath, "exec")
            except SyntaxError as exc:
                problems.append(f"with {b}: {relpath} does not compile with both applied: {exc}")
        patching.revert(installed, [patch], **opts)
        expect(f"reverting {a} did not leave {b} as if applied alone", alone_b)
        patching.revert(installed, **opts)
        expect("reverting both is not byte-identical", pristine)
        patching.apply(installed, [other], allow_unknown_version=True, **opts)
        patching.apply(installed, [patch], allow_unknown_version=True, **opts)
        expect(f"applying {b} then {a} gave other bytes than {a} then {b}", a_then_b)
        patching.revert(installed, [other], **opts)
        expect(f"reverting {b} did not leave {a} as if applied alone", alone_a)
        patching.revert(installed, **opts)
        expect("reverting both is not byte-identical", pristine)
    except PatchError as exc:
        problems.append(f"with {b}: refused: {exc}")
    return problems


# ---- conformance over releases


def _catalog_with(engine_name: str, extra: Sequence[Patch]) -> Catalog:
    """The engine's registered patches, each of ``extra`` in place of the registered one of its id
    (or last, when not registered: a patch under development)."""
    known = [p for p in patch_registry.registry() if p.engine == engine_name]
    by_id = {p.id: p for p in extra if p.engine == engine_name}
    merged = [by_id.pop(p.id, p) for p in known]
    return patch_registry.catalog(engine_name, merged + list(by_id.values()))  # in after= order


def _resolve(ref: PatchRef) -> list[Patch]:
    """A patch, or every registered patch with this id (one per engine)."""
    if isinstance(ref, Patch):
        return [ref]
    found = [p for p in patch_registry.registry() if p.id == ref]
    if not found:
        raise PatchError(f"unknown patch {ref!r}: no registered patch has this id (see `toolkit list`)")
    return found


def conformance_problems(patch: PatchRef, *, releases: Sequence[tuple[str, str]] | None = None,
                         others: Sequence[PatchRef] | None = None) -> dict[str, list[str]]:
    """``{"dist==version": [problem, ...]}`` for ``patch`` on every release (see the module's text);
    an empty list where the release conforms. ``patch``: a ``Patch`` or a registered id (an id both
    engines register is checked for each). ``others``: the patches to compose with (default: every
    other registered patch of the engine that supports the release)."""
    results: dict[str, list[str]] = {}
    patches = _resolve(patch)
    for one in patches:
        chosen = None if others is None else [p for ref in others for p in _resolve(ref) if p.engine == one.engine]
        catalog = _catalog_with(one.engine, [one, *(chosen or [])])
        wanted = releases if releases is not None else _releases.releases_of(one.engine, one.versions)
        if len(patches) > 1:  # an id both engines register: each engine's patch on its own releases
            wanted = [(d, v) for d, v in wanted if _releases.LINES.get(d, ("",))[0] == one.engine]
        for dist, version in wanted:
            results[f"{dist}=={version}"] = _release_problems(one, dist, version, catalog, chosen)
    return results


def _release_problems(patch: Patch, dist: str, version: str, catalog: Catalog,
                      chosen: list[Patch] | None) -> list[str]:
    line = _releases.LINES.get(dist)
    if line is None or line[0] != patch.engine:
        return [f"{dist} is not a {patch.engine} distribution"]
    others = [p for p in (chosen if chosen is not None else catalog.patches)
              if p.id != patch.id and (chosen is not None or p.supports(version))]
    relpaths = sorted(catalog.relpaths())
    try:
        tree = _releases.release_tree(dist, version, relpaths)
    except PatchError as exc:
        return [f"cannot read the release: {exc}"]
    found, total, problems = anchor_problems(tree, patch)
    if problems:
        return problems  # the apply would refuse (fail closed): nothing more to learn on this release
    with tempfile.TemporaryDirectory(prefix="toolkit-conformance-") as tmp:
        problems += golden_problems(tree, patch, Path(tmp) / "alone", allow_unknown_version=True, catalog=catalog)
        own_files = {edit.relpath for edit in patch.files_for(version)}
        for other in others:
            if not own_files & {edit.relpath for edit in other.files_for(version)}:
                continue  # no file in common: each file is planned and written on its own, nothing to compose
            if not all(tree.read(edit.relpath) is not None for edit in other.files_for(version)):
                problems.append(f"with {other.id}: the release lacks a file it edits")
                continue
            problems += composition_problems(tree, patch, other, Path(tmp) / f"with-{other.id}", catalog=catalog)
    return problems


def assert_conforms(patch: PatchRef, *, releases: Sequence[tuple[str, str]] | None = None,
                    others: Sequence[PatchRef] | None = None) -> None:
    """AssertionError naming each release where ``patch`` does not conform (see
    :func:`conformance_problems`), or when there is no release to check it on."""
    name = patch.id if isinstance(patch, Patch) else patch
    try:
        results = conformance_problems(patch, releases=releases, others=others)
    except PatchError as exc:
        raise AssertionError(str(exc)) from None
    if not results:
        raise AssertionError(f"patch {name}: no known release to check it on "
                             "(pass releases=[(distribution, version), ...])")
    failing = {release: problems for release, problems in results.items() if problems}
    if failing:
        lines = [f"  {release}: {problem}" for release, problems in failing.items() for problem in problems]
        raise AssertionError(f"patch {name} does not conform on {', '.join(failing)}:\n" + "\n".join(lines))
