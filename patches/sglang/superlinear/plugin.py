"""SGLang general plugin (0.5.23+, entry point ``sglang.srt.plugins``): add the ``superlinear`` backend.

With ``TOOLKIT_ATTENTION_BACKEND=superlinear`` (the switch every engine shares), registers
``create_superlinear_backend`` under ``superlinear`` in SGLang's attention registry and adds the name
to the CLI's ``--attention-backend`` choices; then ``--attention-backend superlinear`` selects it.
Off, it registers nothing and imports nothing but the standard-library switch. Loaded in every SGLang
process; imports the backend lazily. (SGLang 0.5.9 has no plugins: there the ``superlinear-backend``
patch registers the name through :data:`NAME` and :func:`create`.)
"""

from __future__ import annotations

NAME = "superlinear"


def create(runner):
    from toolkit.patches.sglang.superlinear.backend import create_superlinear_backend
    return create_superlinear_backend(runner)


def add_choice(choices: list) -> None:
    if NAME not in choices:
        choices.append(NAME)


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
