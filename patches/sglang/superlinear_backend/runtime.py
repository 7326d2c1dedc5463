"""What patched SGLang 0.5.9 calls: the ``superlinear`` backend name and factory (the 0.5.23 plugin's own).

Imported by the patched ``attention_registry.py`` in every SGLang process: nothing of the patch engine.
"""

from toolkit.patches.sglang.superlinear.plugin import NAME, create

__all__ = ["NAME", "create"]
