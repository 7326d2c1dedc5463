"""Release source trees of the engines, for any patch: what a conformance run or the release matrix reads.

Kit API v1 at its public path (docs/kit-reference.md); the code is in :mod:`toolkit.kit._releases`.
"""

from toolkit.kit._releases import KNOWN_RELEASES, releases_of, release_tree

__all__ = ["KNOWN_RELEASES", "releases_of", "release_tree"]
