"""Request data that must never be read on the host: the CUDA-graph condition, checkable on CPU.

``request_data(t)`` views ``t`` as :class:`RequestData`; ``item``/``tolist``/``int``/``bool``... of it,
or of any tensor computed from it (torch keeps the subclass through ops), raises.  A decode step
whose queries, cache, block table and lengths are all request data and still runs reads none of
their values on the host: no synchronisation and no shape that depends on them.

Torch only: engine-venv drivers import it.
"""

from __future__ import annotations

import torch


class RequestData(torch.Tensor):
    def _refuse(self, *args, **kwargs):
        raise AssertionError("a value of request data was read on the host")

    item = tolist = __bool__ = __int__ = __index__ = __float__ = _refuse


def request_data(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.as_subclass(RequestData)


def plain(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(torch.Tensor)
