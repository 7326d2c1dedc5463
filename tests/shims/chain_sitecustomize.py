"""Test-only: run the next ``sitecustomize.py`` on ``sys.path`` after a shim's own (Python runs only
the first one it finds, so each shim of tests/shims runs this at its end). Loaded by path, standard
library only."""

import importlib.util
import os
import sys


def run_next(here: str) -> None:
    # Only entries after the shim's own: a shim earlier on the path has run already and chained to it.
    entries = [os.path.abspath(entry or os.getcwd()) for entry in sys.path]
    after = entries[entries.index(here) + 1:] if here in entries else entries
    for entry in after:
        candidate = os.path.join(entry, "sitecustomize.py")
        if entry == here or not os.path.isfile(candidate):
            continue
        spec = importlib.util.spec_from_file_location(f"_toolkit_chained_sitecustomize_{len(after)}", candidate)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return
