"""superlinear-backend applied to a private copy of the real SGLang 0.5.9 (no server): the patched
engine imports with the backend registered, offered on the CLI and let through the Triton check;
revert restores every file byte for byte (turning the backend off gives back the stock engine)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from toolkit.patches.sglang.superlinear_backend.patch import PATCH
from tests.harness.channel import WRITE_RESULT_SNIPPET, DriverRun, run_driver
from tests.harness.fixtures import ensure_engine_python

pytestmark = [pytest.mark.engine]

PROBE = WRITE_RESULT_SNIPPET + r"""
from sglang.srt.layers.attention import attention_registry
from sglang.srt.server_args import ATTENTION_BACKEND_CHOICES, ServerArgs
from sglang.srt.utils.common import support_triton
parser = __import__("argparse").ArgumentParser()
ServerArgs.add_cli_args(parser)
args = parser.parse_args(["--model-path", "m", "--attention-backend", "superlinear"])
write_result({
    "registered": "superlinear" in attention_registry.ATTENTION_BACKENDS,
    "factory": attention_registry.ATTENTION_BACKENDS.get("superlinear", print).__module__,
    "choice": "superlinear" in ATTENTION_BACKEND_CHOICES,
    "cli": args.attention_backend,
    "triton": support_triton("superlinear"),
})
"""


def files_sha(python: str) -> dict[str, str]:
    from toolkit.discovery import find_engines

    (engine,) = [e for e in find_engines(python) if e.engine == "sglang"]
    return {edit.relpath: hashlib.sha256((Path(engine.package_dir) / edit.relpath).read_bytes()).hexdigest()
            for edit in PATCH.files}


def probe(python: str) -> DriverRun:
    return run_driver([python, "-c", PROBE], timeout=300)


def test_patched_0_5_9_offers_superlinear_and_revert_restores_it(tmp_path):
    from tests.patches.sglang.token_ids.private_sglang import private_install
    from toolkit import apply_patch, revert_patch

    python = private_install(ensure_engine_python("sglang-0.5.9"), tmp_path)
    before = files_sha(python)
    stock = probe(python)
    assert stock.returncode != 0 and "invalid choice: 'superlinear'" in stock.stderr
    assert apply_patch(engine="sglang", patches=["superlinear-backend"], python=python)
    try:
        patched = probe(python)
        assert patched.ok() == {
            "registered": True, "factory": "toolkit.patches.sglang.superlinear.plugin", "choice": True,
            "cli": "superlinear", "triton": False,
        }
    finally:
        assert revert_patch(engine="sglang", patches=["superlinear-backend"], python=python)
    assert files_sha(python) == before
