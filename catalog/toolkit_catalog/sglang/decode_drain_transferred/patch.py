"""The ``decode-drain-transferred`` declaration: one SGLang file, one transformer, no runtime."""

from toolkit.declare import FileEdit, Patch

CODEMODS = "toolkit_catalog.sglang.decode_drain_transferred.codemods"

PATCH = Patch(
    id="decode-drain-transferred",
    engine="sglang",
    # every known release from 0.5.9 (slime's pinned one, docker/patch/v0.5.9/) to 0.5.23: its
    # conformance test proves each. No release drains the transfer queue there yet: no `not_needed`.
    versions=">=0.5.9,<=0.5.23",
    files=(FileEdit("srt/disaggregation/decode.py", (f"{CODEMODS}:DecodeSchedulerTransformer",)),),
    summary="PD decode: completed KV transfers move to the waiting queue while retracted requests wait "
            "(they held memory the retracted ones need: a deadlock)",
)
