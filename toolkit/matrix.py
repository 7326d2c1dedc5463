"""``toolkit matrix``: every release of each engine line x every registered patch of its engine.

Kit API v1 at its public path (docs/kit-reference.md); the code is in :mod:`toolkit.kit._matrix`.
"""

from toolkit.kit._matrix import Cell, choose_releases, evaluate, run, problems

__all__ = ["Cell", "choose_releases", "evaluate", "run", "problems"]
