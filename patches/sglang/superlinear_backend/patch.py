"""The ``toolkit.patches.sglang.superlinear_backend`` patch declaration: what it rewrites, on which versions.

Only where SGLang has no plugin mechanism (0.5.9, 0.5.10): from 0.5.11 SGLang loads general plugins
and gets the same backend from this package's entry point (``toolkit.patches.sglang.superlinear.plugin``),
no patch.
"""

from toolkit.declare import FileEdit, Patch
from toolkit.patches.sglang.superlinear.plugin import SGLANG_RELEASES

# Transformers by name: the codemods (libcst) load only when a file is rewritten.
CODEMODS = "toolkit.patches.sglang.superlinear_backend.codemods"

PATCH = Patch(id="superlinear-backend", engine="sglang", versions=">=0.5.9,<0.5.11",
              summary="--attention-backend superlinear (superlinear attention over the token KV pool, CPU included)",
              files=(FileEdit("srt/layers/attention/attention_registry.py", (f"{CODEMODS}:RegistryTransformer",)),
                     FileEdit("srt/server_args.py", (f"{CODEMODS}:ChoicesTransformer",)),
                     FileEdit("srt/utils/common.py", (f"{CODEMODS}:SupportTritonTransformer",))),
              runtime_modules=("toolkit.patches.sglang.superlinear_backend.runtime",),
              not_needed=(SGLANG_RELEASES, "SGLang loads the same backend from serving-toolkit's plugin entry point "
                                           "(--attention-backend superlinear works without this patch)"))
