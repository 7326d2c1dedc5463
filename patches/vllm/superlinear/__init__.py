"""Superlinear attention as a vLLM attention backend, loaded through vLLM's plugin entry point.

No codemod: ``pyproject.toml`` declares ``[project.entry-points."vllm.general_plugins"]`` ->
:func:`toolkit.patches.vllm.superlinear.plugin.register`, which vLLM calls in every process. See
``docs/superlinear.md`` for how to turn it on and configure it.
"""
