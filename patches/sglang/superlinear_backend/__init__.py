"""The patch ``superlinear-backend`` (its folder named after its id, as every patch's): SGLang 0.5.9 and
0.5.10 have no plugin mechanism, so it writes into their sources the registration that the engine plugin
``patches/sglang/superlinear/`` makes through ``sglang.srt.plugins`` on 0.5.11 and later; the backend
itself is the plugin's (``runtime.py`` re-exports it). See ``patch.py`` and docs/superlinear.md.
"""
