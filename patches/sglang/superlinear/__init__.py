"""Superlinear attention as an SGLang attention backend named ``superlinear``.

SGLang 0.5.23 loads it through its ``sglang.srt.plugins`` entry point (``pyproject.toml``):
:func:`toolkit.patches.sglang.superlinear.plugin.register`. SGLang 0.5.9 has no plugin mechanism: the
versioned patch ``superlinear-backend`` (``patches/sglang/superlinear_backend/``) adds the same
registration to its sources. See ``docs/superlinear.md``.
"""
