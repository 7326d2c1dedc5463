"""The PatchStudy client's first import path, kept for code written against it. The client lives beside
its patch, in ``toolkit.patches.vllm.patch_sweep.client`` (docs/patch-sweeps.md)."""

from toolkit.patches.vllm.patch_sweep.client import Activations, CapturedRun, PatchStudy, PatchStudyError, Span, SweepResult

__all__ = ["Activations", "CapturedRun", "PatchStudy", "PatchStudyError", "Span", "SweepResult"]
