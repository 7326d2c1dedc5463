"""The patch authors' kit beyond its public modules (kit API v1 is ``toolkit.declare``, ``toolkit.codemod``,
``toolkit.testing``, ``toolkit.releases`` and ``toolkit.matrix``): ``toolkit new-patch``'s scaffold."""
