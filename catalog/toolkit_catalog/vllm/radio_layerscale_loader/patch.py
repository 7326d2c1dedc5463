"""The ``radio-layerscale-loader`` declaration: one vLLM file, one transformer, no runtime."""

from toolkit.declare import FileEdit, Patch

CODEMODS = "toolkit_catalog.vllm.radio_layerscale_loader.codemods"

PATCH = Patch(
    id="radio-layerscale-loader",
    engine="vllm",
    # every known release: each uses ls1/ls2 in RadioVisionEncoderLayer and skips them when loading
    versions=">=0.24.0,<=0.33.0",
    files=(FileEdit("model_executor/models/radio.py", (f"{CODEMODS}:RadioModelTransformer",)),),
    summary="RADIO vision encoders load their LayerScale weights (ls1/ls2) from the checkpoint and set "
            "absent ones to the configured factor, instead of leaving them at dummy initialisation",
)
