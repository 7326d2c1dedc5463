"""patch-sweep: server-side activation-patching sweeps on vLLM.

With ``TOOLKIT_ENABLE_PATCHING=1`` the API server gains ``/v1/patch_runs`` (capture, list, delete
stored residual-stream activations) and ``/v1/patch_sweep`` (a layers x positions grid of patched
runs, each cell an ordinary request batched by vLLM's scheduler, patched inside the worker by forward
hooks keyed on the request). Without it nothing is added and nothing runs. The contract, with
examples: docs/patch-sweeps.md; the client: ``toolkit.clients.patch_study`` (also importable as ``toolkit.patch_study``).
"""

# The declaration lives in .patch so that importing .runtime inside the engine loads neither libcst
# nor the patch engine.
