"""Attention kernels of the toolkit (``toolkit.kernels.superlinear``: superlinear attention)."""
