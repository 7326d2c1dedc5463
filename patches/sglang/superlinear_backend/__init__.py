"""The ``superlinear-backend`` patch for SGLang 0.5.9 and 0.5.10 (no plugin mechanism there): see ``patch.py``."""
