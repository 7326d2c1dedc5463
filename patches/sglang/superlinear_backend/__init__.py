"""The ``superlinear-backend`` patch for SGLang 0.5.9 (no plugin mechanism there): see ``patch.py``."""
