"""Superlinear attention as an SGLang attention backend named ``superlinear``: an engine plugin, not a
patch (nothing here edits SGLang's files).

SGLang 0.5.11 and later load it through their ``sglang.srt.plugins`` entry point (``pyproject.toml``):
:func:`toolkit.patches.sglang.superlinear.plugin.register` (``plugin.SGLANG_RELEASES``). SGLang 0.5.9 and
0.5.10 have no plugin mechanism: the versioned patch ``superlinear-backend`` (``patches/sglang/superlinear_backend/``) adds the same
registration to its sources. See ``docs/superlinear.md``.
"""
