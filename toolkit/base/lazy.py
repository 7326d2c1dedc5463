"""Module attributes loaded on first use (PEP 562), so that importing a package stays cheap."""

from __future__ import annotations

import importlib

TYPE_CHECKING = False  # typing loads only for type checkers: the command line's start-up passes here
if TYPE_CHECKING:
    from typing import Any, Callable, Mapping


def lazy_attributes(module_name: str, where: Mapping[str, str], namespace: dict[str, Any]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports ``where[name]`` on first use and keeps the value in
    ``namespace`` (the module's globals), so the next lookup is a plain one."""

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        namespace[name] = value
        return value

    return __getattr__
