"""SGLang general plugin (0.5.11+, entry point ``sglang.srt.plugins``): add the ``superlinear`` backend.

With ``TOOLKIT_ATTENTION_BACKEND=superlinear`` (the switch every engine shares), registers
``create_superlinear_backend`` under ``superlinear`` in SGLang's attention registry, adds the name
to the CLI's ``--attention-backend`` choices (``server_args`` before 0.5.20, ``arg_groups.choices``
since), and hooks ``support_triton`` so that ``support_triton("superlinear")`` is False on SGLang's CPU
engine, as for ``torch_native`` (batch set-up then uses its PyTorch helpers, not Triton kernels; from
0.5.22 SGLang's CPU platform says so itself, before it the hook is what lets the backend run on CPU).
Then ``--attention-backend superlinear`` selects it. Off, it registers nothing and imports nothing but
the standard-library switch. Loaded in every SGLang process; imports the backend lazily. (SGLang
0.5.9 and 0.5.10 have no plugins: there the ``superlinear-backend`` patch registers the name through
:data:`NAME` and :func:`create`.)
"""

from __future__ import annotations

NAME = "superlinear"
# The SGLang releases with the general plugin loader (``sglang.srt.plugins``): where this plugin serves.
SGLANG_RELEASES = ">=0.5.11"


def create(runner):
    from toolkit.patches.sglang.superlinear.backend import create_superlinear_backend
    return create_superlinear_backend(runner)


def add_choice(choices: list) -> None:
    if NAME not in choices:
        choices.append(NAME)


def no_triton_on_cpu(support_triton, backend, *args, **kwargs) -> bool:
    """SGLang ``HookType.AROUND`` hook on ``support_triton``: False for ``superlinear`` on the CPU engine."""
    if backend == NAME:
        from sglang.srt.utils.common import is_cpu

        if is_cpu():
            return False
    return support_triton(backend, *args, **kwargs)


def register() -> None:
    from toolkit.patches.common.superlinear.switch import backend_enabled

    if not backend_enabled():  # raises on a value it does not understand
        return
    from sglang.srt.layers.attention import attention_registry

    attention_registry.ATTENTION_BACKENDS.setdefault(NAME, create)
    try:
        from sglang.srt.arg_groups import choices
    except ImportError:  # lines before the arg_groups split keep the list in server_args
        from sglang.srt import server_args as choices
    add_choice(choices.ATTENTION_BACKEND_CHOICES)
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    # load_plugins applies the hooks right after the plugins ran, rebinding the name where it was imported
    HookRegistry.register("sglang.srt.utils.common.support_triton", no_triton_on_cpu, HookType.AROUND)
