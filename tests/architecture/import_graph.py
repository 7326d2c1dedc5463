"""The import graph of this project's packages, read with ``ast`` (nothing is imported or run).

Every ``import`` counts, at module level or inside a function: a lazy import is still a dependency,
and circles through lazy imports are circles all the same.
"""

from __future__ import annotations

import ast
from pathlib import Path

# the reading the codemod cache's key does (toolkit/engine/transform_cache.py), one function for both
from toolkit.engine.transform_cache import imported_names

REPO = Path(__file__).resolve().parents[2]
# folder -> the import name it installs as (setup.py): one namespace, ``toolkit``
PACKAGES = {"toolkit": "toolkit", "patches": "toolkit.patches", "verify": "toolkit.verify",
            "kernels": "toolkit.kernels"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGES[parts[0]], *parts[1:]])


def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for folder in PACKAGES:
        for path in sorted((REPO / folder).rglob("*.py")):
            found[module_name(path)] = path
    return found


def edges() -> dict[str, dict[str, int]]:
    """module -> {imported module of ours: first line}, imports of other projects left out."""
    known = modules()
    graph: dict[str, dict[str, int]] = {name: {} for name in known}
    for name, path in known.items():
        tree = ast.parse(path.read_text(), str(path))
        for target, line in imported_names(tree, name, path.name == "__init__.py", known.__contains__):
            if target in known and target != name:
                graph[name].setdefault(target, line)
    return graph


def cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(graph[child])))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return out


def stray_top_level_imports(folders: tuple[str, ...] = ("toolkit", "patches", "verify", "kernels", "tests", "scripts")
                            ) -> list[str]:
    """Imports of ``patches``, ``verify`` or ``kernels`` as top-level packages anywhere in the repository:
    installed, they exist only as ``toolkit.*``, and from a checkout both would load the same file twice."""
    wrong = []
    for folder in folders:
        for path in sorted((REPO / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            for node in ast.walk(tree):
                names = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
                for name in names:
                    if name.split(".")[0] in ("patches", "verify", "kernels"):
                        wrong.append(f"{path.relative_to(REPO)}:{node.lineno} imports {name}")
    return wrong
