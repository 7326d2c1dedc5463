"""The ``qwen3-coder-param-newline-trim`` declaration: one vLLM file, one transformer, no runtime."""

from toolkit.declare import FileEdit, Patch

CODEMODS = "toolkit_catalog.vllm.qwen3_coder_param_newline_trim.codemods"

PATCH = Patch(
    id="qwen3-coder-param-newline-trim",
    engine="vllm",
    # vLLM 0.24.0-0.25.1: the parser-engine releases that strip() every parameter value
    versions=">=0.24.0,<=0.25.1",
    files=(FileEdit("parser/qwen3.py", (f"{CODEMODS}:Qwen3ParserTransformer",)),),
    summary="qwen3_coder (and nemotron_v3) tool-call parameters lose one wrapping newline instead of all "
            "surrounding whitespace (str_replace-style arguments keep their indentation)",
    not_needed=(">=0.26.0", "vLLM 0.26 trims one wrapping newline itself (_trim_wrapping_newlines)"),
)
