"""What patched SGLang 0.5.9/0.5.10 calls: the ``superlinear`` backend name and factory (the plugin's own).

Imported by the patched ``attention_registry.py`` in every SGLang process: nothing of the patch engine.
"""

from toolkit.patches.sglang.superlinear.plugin import NAME, create

__all__ = ["NAME", "create"]
