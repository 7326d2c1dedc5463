"""The ``sigquit-main-thread`` declaration: one SGLang file, one transformer, no runtime; not needed
from the release that fixed it upstream."""

from toolkit.declare import FileEdit, Patch

CODEMODS = "toolkit_catalog.sglang.sigquit_main_thread.codemods"

PATCH = Patch(
    id="sigquit-main-thread",
    engine="sglang",
    # SGLang 0.5.9, the one release of the kit's range that needs it: its conformance test proves it.
    versions=">=0.5.9,<=0.5.9",
    files=(FileEdit("srt/entrypoints/engine.py", (f"{CODEMODS}:EngineTransformer",)),),
    summary="an engine launched off the main thread (a Ray async actor) skips the SIGQUIT handler "
            "instead of raising ValueError",
    # `toolkit apply-patch` and `status` say "not needed" on these releases instead of "not supported"
    not_needed=(">=0.5.10", "SGLang 0.5.10 registers the SIGQUIT handler only on the main thread itself "
                            "(sgl-project/sglang#6723)"),
)
