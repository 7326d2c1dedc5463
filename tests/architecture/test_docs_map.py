"""docs/architecture.md is the map of the tree, and docs/kit-reference.md the kit's API: both checked
against the code, so neither can drift (issue 52, "the map is the code").

Every product module is on the map, by this rule: every ``.py`` file of ``toolkit/`` and its packages
(``toolkit/engine/plan.py``), every ``.py`` file of ``verify/``; ``patches/__init__.py`` (the registry's entry-point reader), every module directly
in ``patches/common/`` and every folder ``patches/<engine>/<name>/`` (a patch, a plugin or shared code);
every package folder of ``kernels/`` (``kernels/superlinear/triton/``). Each is named by its path.

Every ``module.name`` the map names in backticks (``cli.cmd_apply_or_revert``,
``toolkit.patch_registry.select``, ``codemod.AnchoredTransformer.hit``), where ``module`` is a module
of ``toolkit/`` or ``verify/``, must exist: read with ``ast``, so nothing heavy is imported.
"""

from __future__ import annotations

import ast
import importlib
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MAP = REPO / "docs" / "architecture.md"
KIT_REFERENCE = REPO / "docs" / "kit-reference.md"
KIT_MODULES = ("toolkit.declare", "toolkit.codemod", "toolkit.testing", "toolkit.releases", "toolkit.matrix")
# the folders a `toolkit.<x>` path lives in once installed (pyproject's package-dir)
INSTALLED_AS = {"verify": REPO / "verify", "patches": REPO / "patches", "kernels": REPO / "kernels"}
REFERENCE = re.compile(r"`((?:toolkit\.)?[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+)(?:\([^`]*\))?`")


def product_modules() -> list[str]:
    """The paths the map must name, by the rule in this module's docstring."""
    paths = [p.relative_to(REPO).as_posix() for p in sorted((REPO / "toolkit").rglob("*.py"))]
    paths += [f"verify/{p.name}" for p in sorted((REPO / "verify").glob("*.py"))]
    paths.append("patches/__init__.py")
    paths += [f"patches/common/{p.name}" for p in sorted((REPO / "patches" / "common").glob("*.py"))
              if p.name != "__init__.py"]
    paths += [f"patches/{engine.name}/{folder.name}/" for engine in sorted((REPO / "patches").iterdir())
              if engine.is_dir() and engine.name != "__pycache__"
              for folder in sorted(engine.iterdir()) if (folder / "__init__.py").is_file()]
    paths += [f"{init.parent.relative_to(REPO).as_posix()}/" for init in sorted((REPO / "kernels").rglob("__init__.py"))
              if init.parent != REPO / "kernels"]
    return paths


def missing_modules(text: str) -> list[str]:
    return [path for path in product_modules() if f"`{path}`" not in text and f"`{path.rstrip('/')}`" not in text]


def _module_file(parts: list[str]) -> tuple[Path, list[str]] | None:
    """The source file of the longest module prefix of ``parts`` and the attribute path left, or None
    when ``parts`` does not start with a module of toolkit/ or verify/."""
    if parts[0] == "toolkit":
        parts = parts[1:]
        if parts and parts[0] in INSTALLED_AS:
            base, parts = INSTALLED_AS[parts[0]], parts[1:]
        else:
            base = REPO / "toolkit"
    elif parts[0] == "verify":
        base, parts = REPO / "verify", parts[1:]
    else:
        base = REPO / "toolkit"
    found = (base / "__init__.py", parts) if (base / "__init__.py").is_file() and base != REPO / "toolkit" else None
    folder = base
    for i, part in enumerate(parts):
        if (folder / f"{part}.py").is_file():
            return folder / f"{part}.py", parts[i + 1:]
        if (folder / part / "__init__.py").is_file():
            folder = folder / part
            found = (folder / "__init__.py", parts[i + 1:])
            continue
        break
    return found


def _defines(body: list[ast.stmt], name: str) -> ast.AST | None:
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return node
        targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                   if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any((a.asname or a.name) == name for a in node.names):
            return node
        if isinstance(node, (ast.If, ast.Try)):  # `if TYPE_CHECKING:` / `try: import x`
            inner = _defines(node.body + getattr(node, "orelse", []) + sum((h.body for h in getattr(node, "handlers", [])), []), name)
            if inner is not None:
                return inner
    return None


def documented_names(text: str) -> list[str]:
    """Every backticked ``module.name`` of the map whose module is one of ours."""
    names = []
    for match in REFERENCE.finditer(text):
        parts = match.group(1).split(".")
        if parts[-1] in ("py", "md", "toml", "txt") or _module_file(parts) is None:
            continue
        names.append(match.group(1))
    return names


def dead_names(text: str) -> list[str]:
    """The documented ``module.name`` paths the code does not define."""
    dead = []
    for name in documented_names(text):
        path, attributes = _module_file(name.split("."))
        body = ast.parse(path.read_text()).body
        for attribute in attributes:
            node = _defines(body, attribute)
            if node is None:
                dead.append(name)
                break
            body = node.body if isinstance(node, ast.ClassDef) else []
    return dead


def test_every_product_module_is_on_the_map():
    assert len(product_modules()) > 60  # the rule found the tree, not nothing
    assert missing_modules(MAP.read_text()) == []


def test_every_documented_function_exists():
    text = MAP.read_text()
    names = documented_names(text)
    assert len(names) >= 20 and "cli.cmd_apply_or_revert" in names, names  # the walks are read, not skipped
    assert dead_names(text) == []


def test_the_checks_fail_on_a_map_that_drifted():
    text = MAP.read_text()
    assert "`toolkit/engine/plan.py`" in text and "`patches/vllm/tito/`" in text and "`engine.plan.make_plan`" in text
    without_plan = text.replace("`toolkit/engine/plan.py`", "`plan`")
    assert missing_modules(without_plan) == ["toolkit/engine/plan.py"]
    without_tito = text.replace("`patches/vllm/tito/`", "the tito folder")
    assert missing_modules(without_tito) == ["patches/vllm/tito/"]
    renamed = text + "\nThen `engine.plan.make_the_plan` and `codemod.AnchoredTransformer.hit_twice` and `toolkit.verify.run.nowhere`.\n"
    assert dead_names(renamed) == ["engine.plan.make_the_plan", "codemod.AnchoredTransformer.hit_twice",
                                   "toolkit.verify.run.nowhere"]


def test_the_kit_reference_names_every_public_name_and_is_generated():
    reference = KIT_REFERENCE.read_text()
    for module_name in KIT_MODULES:
        module = importlib.import_module(module_name)
        assert module.__all__, module_name
        assert f"## `{module_name}`" in reference, module_name
        for name in module.__all__:
            assert getattr(module, name, None) is not None, f"{module_name}.__all__ names {name}, which it lacks"
            assert re.search(rf"^### `{re.escape(name)}[(` =]", reference, re.M), f"{module_name}.{name}"
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "kit_reference.py"), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    assert "kit-reference.md" in (REPO / "docs" / "writing-patches.md").read_text()


RULE = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def test_every_rule_of_the_map_names_a_test_that_exists():
    """The map's "rules" table names, for each rule, the test that holds it: each named test exists (read
    with ast), so a rule cannot outlive its check, and the table is not empty."""
    text = MAP.read_text()
    section = text.split("## The rules, each with the test that holds it", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and "`tests/" in line]
    named = RULE.findall(section)
    assert len(rows) >= 20 and all(RULE.search(row) for row in rows)
    missing = []
    for path, name in named:
        source = REPO / path
        tests = {node.name for node in ast.parse(source.read_text()).body if isinstance(node, ast.FunctionDef)} \
            if source.is_file() else set()
        if name not in tests:
            missing.append(f"{path}::{name}")
    assert missing == []
