"""Two small patches over a throwaway engine tree, to test the patch engine's mechanics.

The real patches are tested against real engine sources in tests/patches/; here the engine tree is
made up so that every failure mode (missing anchor, drift, crash between writes) is cheap to set up.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import libcst as cst
import libcst.matchers as m

from toolkit.codemod import AnchoredTransformer, FileEdit, Patch

SERVING = textwrap.dedent(
    '''\
    class Serving:
        def handle(self, request):
            return {"text": request}

        def other(self):
            return 1
    '''
)
PROTOCOL = textwrap.dedent(
    '''\
    class Response:
        text: str
    '''
)


def make_engine_tree(root: Path, version: str = "0.5.9", engine: str = "sglang") -> Path:
    """A site-packages-like tree with an engine package and its dist-info; returns the site dir."""
    package = root / engine
    (package / "srt").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "srt" / "__init__.py").write_text("")
    (package / "srt" / "serving.py").write_text(SERVING)
    (package / "srt" / "protocol.py").write_text(PROTOCOL)
    dist = root / f"{engine}-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {engine}\nVersion: {version}\n")
    return root


def write_record(site: Path, package: str = "sglang") -> None:
    """pip's RECORD for the tree's package as it is now (what `toolkit repair` checks against)."""
    import base64
    import hashlib

    (dist_info,) = site.glob(f"{package}-*.dist-info")
    rows = []
    for path in sorted((site / package).rglob("*")):
        if path.is_file():
            digest = base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()
            rows.append(f"{path.relative_to(site)},sha256={digest},{path.stat().st_size}")
    (dist_info / "RECORD").write_text("\n".join(rows) + "\n")


class AddFieldToResponse(AnchoredTransformer):
    ANCHORS = {"class Response": "the response model"}

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        if not m.matches(updated_node, m.ClassDef(name=m.Name("Response"))):
            return updated_node
        self.hit("class Response")
        field = cst.parse_statement(f"token_ids: list | None = None  {self.marker}\n")
        body = list(updated_node.body.body) + [field]
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))


class WrapHandle(AnchoredTransformer):
    ANCHORS = {"Serving.handle": "the request handler"}

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if not m.matches(updated_node, m.FunctionDef(name=m.Name("handle"))):
            return updated_node
        self.hit("Serving.handle")
        first = cst.parse_statement(f"request = request  {self.marker}\n")
        body = [first] + list(updated_node.body.body)
        return updated_node.with_changes(body=updated_node.body.with_changes(body=body))


class AddOtherComment(AnchoredTransformer):
    ANCHORS = {"Serving.other": "a second method"}

    def leave_FunctionDef(self, original_node: cst.FunctionDef, updated_node: cst.FunctionDef) -> cst.FunctionDef:
        if not m.matches(updated_node, m.FunctionDef(name=m.Name("other"))):
            return updated_node
        self.hit("Serving.other")
        first = cst.parse_statement(f"pass  {self.marker}\n")
        return updated_node.with_changes(body=updated_node.body.with_changes(body=[first, *updated_node.body.body]))


class MissingAnchor(AnchoredTransformer):
    ANCHORS = {"Serving.nonexistent": "a method that is not there"}


class BreaksSyntax(AnchoredTransformer):
    """Produces code that parses as a CST but does not compile (a return outside a function)."""

    ANCHORS = {"class Response": "the response model"}

    def leave_ClassDef(self, original_node: cst.ClassDef, updated_node: cst.ClassDef) -> cst.ClassDef:
        self.hit("class Response")
        bad = cst.parse_statement("return 1\n")
        return updated_node.with_changes(body=updated_node.body.with_changes(body=[*updated_node.body.body, bad]))


DEMO = Patch(
    id="demo",
    engine="sglang",
    versions=">=0.5.9,<=0.5.23",
    files=(FileEdit("srt/protocol.py", (AddFieldToResponse,)), FileEdit("srt/serving.py", (WrapHandle,))),
    summary="adds a field and wraps a handler",
)
SECOND = Patch(
    id="second",
    engine="sglang",
    versions=">=0.5,<1",
    files=(FileEdit("srt/serving.py", (AddOtherComment,)),),
    summary="edits a file the demo patch edits too",
)
BROKEN = Patch(
    id="broken",
    engine="sglang",
    versions=">=0,<1",
    files=(FileEdit("srt/protocol.py", (AddFieldToResponse,)), FileEdit("srt/serving.py", (MissingAnchor,))),
    summary="its second file's anchor is missing",
)
UNCOMPILABLE = Patch(
    id="uncompilable",
    engine="sglang",
    versions=">=0,<1",
    files=(FileEdit("srt/protocol.py", (BreaksSyntax,)),),
    summary="produces code that does not compile",
)
ALL = [DEMO, SECOND, BROKEN, UNCOMPILABLE]
