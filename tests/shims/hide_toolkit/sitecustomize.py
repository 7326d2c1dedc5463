"""Test-only: make ``toolkit`` unimportable in the interpreters of one environment, as if
serving-toolkit had been uninstalled from it (``pip uninstall`` without a revert).

Not part of the product. A test puts this folder on ``PYTHONPATH`` and names the environment in
``TOOLKIT_TEST_HIDE_TOOLKIT_IN`` (its ``sys.prefix``): there, every import of ``toolkit`` or a
submodule fails with the ``ModuleNotFoundError`` an uninstalled package gives, and its entry points are gone, in the process
and in every process it spawns; other interpreters (the test runner's, the CLI's) are left alone. Then it runs
the next ``sitecustomize`` on ``sys.path`` (the SGLang shim's), which this file would otherwise hide.
"""

import os
import runpy
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _HideToolkit:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "toolkit" or name.startswith("toolkit."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def _chain() -> None:
    runpy.run_path(os.path.join(_HERE, "../chain_sitecustomize.py"))["run_next"](_HERE)


def _hide_entry_points() -> None:
    """An uninstalled distribution's entry points are gone too (the engines' plugin loaders read them)."""
    import importlib.metadata as metadata

    every = metadata.entry_points

    def keep(found):
        return metadata.EntryPoints(
            ep for ep in found if (getattr(ep.dist, "name", "") or "").lower().replace("_", "-") != "serving-toolkit")

    def entry_points(**params):
        found = every(**params)
        if isinstance(found, metadata.EntryPoints):
            return keep(found)
        if isinstance(found, dict):  # Python 3.11 without arguments: every group
            return type(found)({group: keep(eps) for group, eps in found.items()})
        return found

    metadata.entry_points = entry_points


if os.path.realpath(sys.prefix) == os.path.realpath(os.environ.get("TOOLKIT_TEST_HIDE_TOOLKIT_IN", "/nonexistent")):
    sys.meta_path.insert(0, _HideToolkit())
    _hide_entry_points()
_chain()
