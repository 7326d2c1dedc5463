"""Driver (run by test_releases.py in one SGLang release's venv): the backend chosen as a server chooses it.

Usage: ``python release_driver.py plugin|patch`` on SGLang's CPU engine (``SGLANG_USE_CPU_ENGINE=1``);
writes a JSON result to ``$TOOLKIT_TEST_RESULT_FILE``.  ``plugin``: SGLang's own ``load_plugins()``
runs this package's entry point (``TOOLKIT_ATTENTION_BACKEND=superlinear``), as ``launch_server`` does
before it parses the command line; ``patch``: the interpreter's sglang has ``superlinear-backend``
applied.  Then, through SGLang's code: the CLI parses ``--attention-backend superlinear``, the batch
set-up's ``compute_position`` (Triton or PyTorch, by ``support_triton``) runs on CPU tensors, and the
backend comes from the attention registry's factory and runs ``cuda_driver.main``'s quick case:
prompts, chunks and decodes over the real token pools (CPU gather path) against the naive reference.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[4]))  # the repo, for the result channel
from tests.harness.channel import write_result  # noqa: E402
from tests.patches.sglang.superlinear.cuda_driver import main as run_cases  # noqa: E402

sys.path.pop(0)


def main(mode: str) -> None:
    if mode == "plugin":
        from sglang.srt.plugins import load_plugins

        load_plugins()
    from sglang.srt.layers.attention import attention_registry
    from sglang.srt.model_executor import forward_batch_info
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    try:
        cli = parser.parse_args(["--model-path", "m", "--attention-backend", "superlinear"]).attention_backend
    except SystemExit:
        cli = None
    try:  # positions of two extends: 2 tokens after a 3-token prefix, 4 from the start
        positions = forward_batch_info.compute_position(
            "superlinear", torch.tensor([3, 0]), torch.tensor([2, 4]), 6)[0].tolist()
    except Exception as exc:  # Triton kernels on CPU tensors: what the CPU engine must not reach
        positions = f"{type(exc).__name__}: {exc}"[:300]
    factory = attention_registry.ATTENTION_BACKENDS.get("superlinear")
    result = {"cli": cli, "positions": positions,
              "factory": getattr(factory, "__module__", None), "support_triton": forward_batch_info.support_triton("superlinear")}
    if factory is not None:
        result.update(run_cases(factory, replay=False, quick=True))
    write_result(result)


if __name__ == "__main__":
    main(sys.argv[1])
