"""Triton kernels of superlinear attention (GPU; CPU only through ``TRITON_INTERPRET=1``).

``prefill.triton_superlinear_attention`` / ``decode.triton_superlinear_decode`` are the entry
points; ``toolkit.kernels.superlinear.dispatch`` calls them.  Importing this package does not import triton.
"""
