"""Attention kernels of the toolkit (``kernels.superlinear``: superlinear attention)."""
