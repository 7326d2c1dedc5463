"""Patching every node of a Ray cluster, and the engine-start check of a patched cluster."""
