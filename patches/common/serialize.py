"""Response serialization helpers the patches' runtimes share (standard library only)."""

from __future__ import annotations

import functools
from typing import Any, Callable


def omit_when_none(*names: str) -> Callable[[Callable], Callable]:
    """Wrap a pydantic ``model_serializer(mode="wrap")`` so the named fields are left out when None."""

    def decorate(serializer: Callable) -> Callable:
        @functools.wraps(serializer)  # pydantic reads the signature through __wrapped__
        def serialize(self: Any, handler: Any, *rest: Any) -> Any:
            data = serializer(self, handler, *rest)
            if isinstance(data, dict):
                for name in names:
                    if getattr(self, name, None) is None:
                        data.pop(name, None)
            return data

        return serialize

    return decorate
