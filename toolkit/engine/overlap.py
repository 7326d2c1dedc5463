"""Which functions a patch edits in a file, and the refusal of two patches that edit the same one
without an order between them.

Two patches from any two packages may rewrite one engine file; where both rewrite the same function,
the second one's edit is made on the first one's result, so their order decides the code. That order
is declared (``Patch(after=...)``), never implied by how entry-point tables happen to be read: a plan
that would apply two such patches with no ``after=`` between them stops before it writes anything.

"Edits a function" is read off the code itself: the functions (methods and nested functions by their
qualified names, ``Class.method``) whose syntax tree differs between a patch's input and its output.
Comments do not count (``ast`` drops them), so marking a line is no edit; a function a patch adds
counts as edited by it.
"""

from __future__ import annotations

import ast
import functools
from typing import Callable, Sequence

from toolkit.errors import PatchError


@functools.lru_cache(maxsize=64)  # a plan asks again for the same texts (each patch's input and output)
def functions_in(source: str) -> dict[str, str]:
    """Qualified name -> the dump of its syntax tree (no positions), for every function in ``source``."""
    functions: dict[str, str] = {}

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                functions.setdefault(name, ast.dump(child))  # a redefinition: the first one names it
                walk(child, name + ".")
            elif isinstance(child, ast.ClassDef):
                walk(child, f"{prefix}{child.name}.")
            else:
                walk(child, prefix)  # functions under if/try at any level keep their plain names

    walk(ast.parse(source), "")
    return functions


def edited_functions(before: str, after: str) -> frozenset[str]:
    """The qualified names of the functions whose code differs between ``before`` and ``after``."""
    old, new = functions_in(before), functions_in(after)
    return frozenset(name for name in old.keys() | new.keys() if old.get(name) != new.get(name))


def refuse_unordered(relpath: str, steps: Sequence[tuple[str, str, str]], ordered_between: Callable[[str, str], bool],
                     engine: str, engine_version: str) -> None:
    """``steps``: (patch id, its input, its output) for each patch on ``relpath`` in the order they
    apply. Raises when two of them edit one function and no ``after=`` orders them."""
    if len(steps) < 2:
        return
    edited = [(patch_id, edited_functions(before, after)) for patch_id, before, after in steps]
    for position, (first, first_edits) in enumerate(edited):
        for second, second_edits in edited[position + 1:]:
            shared = first_edits & second_edits
            if shared and not ordered_between(first, second):
                function = max(sorted(shared), key=lambda name: name.count("."))  # the innermost one
                raise PatchError(
                    f"patches {first} and {second} both edit {function} in {relpath} ({engine} {engine_version}) "
                    f"and neither declares the other in after=, so the order they apply in is not defined; add "
                    f"after=({first!r},) to {second} (or the reverse) to apply both; nothing was written")
