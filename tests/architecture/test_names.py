"""One name for one thing (issue 59): no two product modules share a file name, the served engines are
spelled in one table, and a constant or helper is defined once, where the map says.

Product modules: every ``.py`` of ``toolkit/``, ``patches/``, ``verify/`` and ``kernels/`` (installed as
``toolkit``, ``toolkit.patches``, ``toolkit.verify``, ``toolkit.kernels``), read with ``ast``.
"""

from __future__ import annotations

import ast
import collections
import re
from pathlib import Path

from tests.architecture.import_graph import REPO

PRODUCT = ("toolkit", "patches", "verify", "kernels")

# Names the layout gives many modules on purpose, each with the rule that makes it so. A face and the
# module it fronts share a name too (checked apart: the face holds no code and imports from that module).
CONVENTIONS = {
    "patch": "a patch's declaration (patches/<engine>/<id>/patch.py: the entry point names it)",
    "codemods": "a patch's transformers",
    "runtime": "what a patched engine imports (toolkit.patches.<engine>.<id>.runtime: a runtime contract)",
    "plugin": "an engine plugin's registration (the engine's entry point names it)",
    "backend": "an engine plugin's attention backend",
    "tito": "a feature's folder, per engine and shared (patches/<engine>/tito/, patches/common/tito/)",
    "superlinear": "a feature's folder, per engine, shared and kernel (patches/*/superlinear/, kernels/superlinear/)",
    "decode": "a kernel stage, mirrored by each implementation (kernels/<op>/{triton,gather}/<stage>.py)",
    "merge": "a kernel stage, mirrored by each implementation",
    "prefill": "a kernel stage, mirrored by each implementation",
    "search": "a kernel stage, mirrored by each implementation",
}


def product_files(root: Path = REPO) -> list[Path]:
    return [p for folder in PRODUCT for p in sorted((root / folder).rglob("*.py")) if "__pycache__" not in p.parts]


def module_names(root: Path = REPO) -> dict[str, list[str]]:
    """Each module's and package folder's name (a leading ``_`` dropped: ``_audit`` is ``audit``) -> where."""
    names: dict[str, list[str]] = collections.defaultdict(list)
    for path in product_files(root):
        if path.name != "__init__.py":
            names[path.stem.lstrip("_")].append(path.relative_to(root).as_posix())
        elif path.parent.name not in PRODUCT:
            names[path.parent.name.lstrip("_")].append(path.parent.relative_to(root).as_posix() + "/")
    return names


def is_face(path: Path) -> str | None:
    """The one module a face fronts, when ``path`` is a face: a docstring, imports from that module (and,
    for the declarations ``toolkit.codemod`` lists, from the kit's), an ``__all__``, nothing else."""
    body = ast.parse(path.read_text()).body
    imports = [node for node in body if isinstance(node, ast.ImportFrom)]
    rest = [node for node in body if not isinstance(node, ast.ImportFrom)]
    docstring = rest[:1] if rest and isinstance(rest[0], ast.Expr) and isinstance(rest[0].value, ast.Constant) else []
    alls = [node for node in rest if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["__all__"]]
    if len(docstring) + len(alls) != len(rest) or not imports or len(alls) != 1:
        return None
    sources = [node.module for node in imports if node.module != "__future__"]
    return sources[0] if sources else None


def test_no_two_product_modules_share_a_file_name():
    shared = {name: where for name, where in module_names().items() if len(where) > 1 and name not in CONVENTIONS}
    faces = {}
    for name, where in list(shared.items()):
        # a face (toolkit/declare.py) beside the module it fronts (toolkit/kit/_declare.py): one thing, two paths
        if len(where) == 2 and all(w.endswith(".py") for w in where):
            fronted = [is_face(REPO / w) for w in where]
            owners = [w[:-3].replace("/", ".") for w in where]
            if any(f is not None and f in owners for f in fronted):
                faces[name] = where
                del shared[name]
    assert shared == {}
    assert set(faces) == {"declare", "codemod", "testing", "releases", "matrix", "patch_study"}, faces


def test_each_naming_convention_is_still_used():
    """An entry of CONVENTIONS that no longer names two modules is dead and goes (it could hide a new clash)."""
    names = module_names()
    assert [name for name in CONVENTIONS if len(names.get(name, ())) < 2] == []


def test_the_rule_sees_a_clash(tmp_path):
    """Two modules of one name are seen (a private one and a folder too), and a face is told from a module
    with code: the rule can fail."""
    for relpath in ("toolkit/kit/_audit.py", "toolkit/cli/audit.py", "verify/base.py", "toolkit/base/__init__.py"):
        (tmp_path / relpath).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relpath).write_text("")
    names = module_names(tmp_path)
    assert sorted(names["audit"]) == ["toolkit/cli/audit.py", "toolkit/kit/_audit.py"]
    assert sorted(names["base"]) == ["toolkit/base/", "verify/base.py"]
    assert is_face(REPO / "toolkit" / "declare.py") == "toolkit.kit._declare"
    assert is_face(REPO / "toolkit" / "kit" / "_declare.py") is None
    assert is_face(REPO / "toolkit" / "ray.py") == "toolkit.cluster.every_node"


def _string_constants(tree: ast.AST) -> list[tuple[int, str]]:
    """The strings the code uses (a docstring is prose about the code, not a sentence it says)."""
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


# "vllm or sglang", "'vllm', 'sglang'", "vllm, sglang": the engines listed in words
ENGINES_IN_A_SENTENCE = re.compile(r"""\bvllm['"]?\s*(?:,|or)\s*['"]?sglang\b""", re.I)


def test_the_engine_names_are_spelled_once():
    """The served engines are one table, toolkit/base/engines.py: no other module of toolkit/ or verify/ lists
    them (a tuple, list or set of names holding both, "vllm or sglang" or "'vllm', 'sglang'" in a sentence). A dict keyed by
    engine is per-engine data (a parser's name on each), not the list of engines."""
    table = REPO / "toolkit" / "base" / "engines.py"
    wrong = []
    for path in product_files():
        if path == table or path.parts[len(REPO.parts)] not in ("toolkit", "verify"):
            continue
        tree = ast.parse(path.read_text())
        where = path.relative_to(REPO).as_posix()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
                words = {item.value for item in node.elts if isinstance(item, ast.Constant)}
                if {"vllm", "sglang"} <= words:
                    wrong.append(f"{where}:{node.lineno} lists the engines")
        wrong += [f"{where}:{line} says {text!r}" for line, text in _string_constants(tree)
                  if ENGINES_IN_A_SENTENCE.search(text)]
    assert wrong == []


def test_every_command_takes_the_engines_of_the_table():
    from toolkit.base import engines
    from toolkit.cli.parser import build_parser
    from toolkit.kit import _scaffold

    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    engine_choices = {}
    for command, sub in subparsers.choices.items():
        for action in sub._actions:
            if action.dest == "engine" and action.choices is not None:
                engine_choices[command] = tuple(action.choices)
    assert set(engine_choices) >= {"list", "apply-patch", "revert", "status", "verify", "matrix", "new-patch"}
    assert set(engine_choices.values()) == {engines.ENGINE_NAMES}
    assert tuple(_scaffold.TARGETS) == engines.ENGINE_NAMES


ONE_PER_MODULE = {
    # the same name in several modules on purpose, one meaning
    "CHECKS": "each check module's list of its checks, gathered by toolkit.verify.checks.suite",
    "TYPE_CHECKING": "False at run time: typing is not imported where start-up time counts",
}


def test_each_constant_is_defined_once():
    """An UPPER_CASE module constant of toolkit/ or verify/ is defined in one module (issue 59 found
    STATE_DIRNAME, FILE_MODE, JSON_SCHEMA and ENTRY_POINT_GROUP twice), and did_you_mean in one."""
    defined: dict[str, list[str]] = collections.defaultdict(list)
    for path in product_files():
        if path.parts[len(REPO.parts)] not in ("toolkit", "verify"):
            continue
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
            for target in targets:
                if isinstance(target, ast.Name) and target.id.isupper() and not target.id.startswith("_"):
                    defined[target.id].append(path.relative_to(REPO).as_posix())
            if isinstance(node, ast.FunctionDef) and node.name == "did_you_mean":
                defined["did_you_mean"].append(path.relative_to(REPO).as_posix())
    twice = {name: where for name, where in defined.items() if len(where) > 1 and name not in ONE_PER_MODULE}
    assert twice == {}
    assert defined["did_you_mean"] == ["toolkit/base/suggest.py"]
    assert defined["ENTRY_POINT_GROUP"] == ["toolkit/patch_registry.py"]
    assert defined["ENGINES"] == ["toolkit/base/engines.py"]
