"""The ``toolkit.patches.vllm.patch_sweep`` patch declaration: what it rewrites, on which versions."""

from toolkit.declare import FileEdit, Patch

# Transformers by name: the codemods (libcst) load only when a file is rewritten.
CODEMODS = "toolkit.patches.vllm.patch_sweep.codemods"

PATCH = Patch(id="patch-sweep", engine="vllm", versions=">=0.24,<0.34",
              summary="activation-patching sweeps and activation capture served by vLLM (TOOLKIT_ENABLE_PATCHING=1): "
                      "/v1/patch_runs, /v1/patch_sweep, /v1/activations",
              # vLLM 0.29 moved build_app and the engine client's set-up out of entrypoints/openai/api_server.py
              # (which stays, re-exporting them): the hooks go where the functions are on each release
              files=(FileEdit("entrypoints/launchers/app.py", (f"{CODEMODS}:AppTransformer",), versions=">=0.29"),
                     FileEdit("entrypoints/launchers/api_server/entry.py", (f"{CODEMODS}:EntryTransformer",),
                              versions=">=0.29"),
                     FileEdit("entrypoints/openai/api_server.py",
                              (f"{CODEMODS}:InlineRoutersAppTransformer", f"{CODEMODS}:EntryTransformer"), versions="<0.29"),
                     FileEdit("v1/worker/worker_base.py", (f"{CODEMODS}:WorkerWrapperTransformer",)),
                     FileEdit("v1/core/kv_cache_utils.py", (f"{CODEMODS}:BlockHashTransformer",))),
              runtime_modules=("toolkit.patches.vllm.patch_sweep.runtime",
                               "toolkit.patches.vllm.patch_sweep.routes",
                               "toolkit.patches.vllm.patch_sweep.refusals",
                               "toolkit.patches.vllm.patch_sweep.engine_client",
                               "toolkit.patches.vllm.patch_sweep.bodies",
                               "toolkit.patches.vllm.patch_sweep.sweep",
                               "toolkit.patches.vllm.patch_sweep.execution",
                               "toolkit.patches.vllm.patch_sweep.activations",
                               "toolkit.patches.vllm.patch_sweep.worker",
                               "toolkit.patches.vllm.patch_sweep.store",
                               "toolkit.patches.vllm.patch_sweep.batched",
                               "toolkit.patches.vllm.patch_sweep.arrays",
                               "toolkit.patches.vllm.patch_sweep.steering"))
