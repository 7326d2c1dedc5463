"""Test-only stand-in for ``sgl_kernel``, SGLang's CUDA-only kernel package.

Not part of the product. SGLang 0.5.9 imports ``sgl_kernel`` at module level, and the PyPI build of
it cannot load without CUDA, so the tests put ``tests/shims`` on ``PYTHONPATH`` (every process of a
server inherits it). Any name, and any ``sgl_kernel.<submodule>``, resolves to a placeholder that
raises ``NotImplementedError`` when called: on CPU SGLang takes its torch-native paths, and a
placeholder that does get called points at the kernel that was wanted. ``torch.ops.sgl_kernel``
stays empty, so SGLang's ``hasattr(torch.ops.sgl_kernel, ...)`` probes still answer "no kernels".
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys

__version__ = "0.0.0+toolkit.test.stub"
TOOLKIT_TEST_STUB = True


class _Missing:
    """A CUDA kernel that is not here: attribute chains resolve, calls raise."""

    def __init__(self, name: str) -> None:
        self.__name__ = self.__qualname__ = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self.__name__} is a CUDA kernel; sgl_kernel is a test stub here (tests/shims)")

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Missing(f"{self.__name__}.{attr}")

    def __repr__(self) -> str:
        return f"<sgl_kernel stub {self.__name__}>"


def _module_getattr(module_name: str):
    def __getattr__(name: str):
        if name.startswith("__"):
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        return _Missing(f"{module_name}.{name}")

    return __getattr__


__getattr__ = _module_getattr(__name__)


class _SubmoduleLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        module.__getattr__ = _module_getattr(module.__name__)
        module.TOOLKIT_TEST_STUB = True


class _SubmoduleFinder(importlib.abc.MetaPathFinder):
    """Resolves every ``sgl_kernel.x.y`` to an empty stub package."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith(__name__ + "."):
            spec = importlib.machinery.ModuleSpec(fullname, _SubmoduleLoader(), is_package=True)
            spec.submodule_search_locations = []
            return spec
        return None


if not any(isinstance(f, _SubmoduleFinder) or type(f).__name__ == "_SubmoduleFinder" for f in sys.meta_path):
    sys.meta_path.insert(0, _SubmoduleFinder())
