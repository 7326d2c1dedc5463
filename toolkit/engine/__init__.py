"""The patch engine: plans, journals and writes an install's patched files, and reads them back."""
