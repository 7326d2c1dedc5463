"""Loading a stdlib-only script of scripts/ as a module (``scripts`` is not a package of the product)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPTS = Path(__file__).resolve().parents[1]


def load_script(filename: str, module_name: str):
    """``scripts/<filename>`` as the module ``module_name``, loaded once per process: a second load
    would make the first one's dataclasses unpicklable (their module in ``sys.modules`` is another)."""
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, SCRIPTS / filename)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # its dataclasses resolve their annotations (and pickle) through it
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module
