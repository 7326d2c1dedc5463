"""The SGLang plugin in the real SGLang 0.5.23 venv, loaded by SGLang's own loader (no server): with
the switch off it registers nothing and imports nothing of the kernels; on, it adds the backend."""

from __future__ import annotations

import os

import pytest

from tests.harness.channel import WRITE_RESULT_SNIPPET, run_driver
from tests.harness.fixtures import ensure_engine_python

pytestmark = [pytest.mark.engine]

PROBE = WRITE_RESULT_SNIPPET + r"""
import sys
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.layers.attention import attention_registry
try:
    from sglang.srt.arg_groups import choices
except ImportError:
    from sglang.srt import server_args as choices
write_result({
    "registered": "superlinear" in attention_registry.ATTENTION_BACKENDS,
    "choice": "superlinear" in choices.ATTENTION_BACKEND_CHOICES,
    "ours_loaded": sorted(m for m in sys.modules if m.startswith("toolkit.kernels")
                          or m.startswith(("toolkit.patches.sglang.superlinear.backend", "toolkit.patches.common.superlinear.config"))),
})
"""


def probe(**env: str):
    full = {k: v for k, v in os.environ.items() if not k.startswith("TOOLKIT_")}
    full.update(env)
    return run_driver([ensure_engine_python("sglang-0.5.23"), "-c", PROBE], env=full, timeout=300)


def test_off_registers_nothing_and_imports_no_kernels():
    assert probe().ok() == {"registered": False, "choice": False, "ours_loaded": []}


def test_on_registers_the_backend_and_the_cli_choice():
    got = probe(TOOLKIT_ATTENTION_BACKEND="superlinear").ok()
    assert got["registered"] and got["choice"], got
    assert got["ours_loaded"] == [], got  # the backend itself loads only when a server builds it


def test_a_bad_switch_value_is_named_and_nothing_is_registered():
    """SGLang's loader logs a plugin's error and goes on (vLLM's stops): the log names the variable and
    what to write, and the engine stays stock, so ``--attention-backend superlinear`` is refused."""
    run = probe(TOOLKIT_ATTENTION_BACKEND="superlinaer")
    assert "TOOLKIT_ATTENTION_BACKEND='superlinaer' is not understood" in run.stderr, run.stderr[-2000:]
    assert run.ok() == {"registered": False, "choice": False, "ours_loaded": []}
