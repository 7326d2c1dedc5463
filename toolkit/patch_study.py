"""The PatchStudy client's first import path, kept for code written against it. The client lives in
``toolkit.clients.patch_study`` (docs/patch-sweeps.md)."""

from toolkit.clients.patch_study import Activations, CapturedRun, PatchStudy, PatchStudyError, Span, SweepResult

__all__ = ["Activations", "CapturedRun", "PatchStudy", "PatchStudyError", "Span", "SweepResult"]
