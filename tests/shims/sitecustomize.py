"""Test-only: stub ``sgl_kernel`` (SGLang's CUDA-only kernel package) in every Python process.

Not part of the product. The tests put ``tests/shims`` on ``PYTHONPATH`` for SGLang servers; every
process a server spawns inherits it and runs this file at start-up, which binds ``sgl_kernel`` to the
stub beside it (``tests/shims/sgl_kernel``) before any SGLang code runs, even where something later
reorders ``sys.path`` or a real, unloadable ``sgl_kernel`` is installed. Then it runs the next
``sitecustomize`` on ``sys.path``, if any, which this file would otherwise hide.
"""

import importlib.util
import os
import runpy
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _bind_stub() -> None:
    if "sgl_kernel" in sys.modules:
        return
    init = os.path.join(_HERE, "sgl_kernel", "__init__.py")
    spec = importlib.util.spec_from_file_location(
        "sgl_kernel", init, submodule_search_locations=[os.path.dirname(init)])
    module = importlib.util.module_from_spec(spec)
    sys.modules["sgl_kernel"] = module
    spec.loader.exec_module(module)


def _chain() -> None:
    runpy.run_path(os.path.join(_HERE, "chain_sitecustomize.py"))["run_next"](_HERE)


_bind_stub()
_chain()
