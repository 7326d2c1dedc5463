"""The ``namespace-tool-import-guard`` declaration: one vLLM file, one transformer, no runtime."""

from toolkit.declare import FileEdit, Patch

CODEMODS = "toolkit_catalog.vllm.namespace_tool_import_guard.codemods"

PATCH = Patch(
    id="namespace-tool-import-guard",
    engine="vllm",
    # vLLM 0.25.0 (the first to import NamespaceTool there) to 0.33.0; 0.24 does not import it.
    versions=">=0.25.0,<=0.33.0",
    files=(FileEdit("tool_parsers/utils.py", (f"{CODEMODS}:ToolParserUtilsTransformer",)),),
    summary="vLLM's tool parsers import with openai < 2.25 (no NamespaceTool there: a stub that no "
            "object is an instance of stands in) instead of failing at import",
)
