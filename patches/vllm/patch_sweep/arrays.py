"""Arrays on the wire for ``/v1/activations``: raw little-endian bytes with a dtype name and a shape,
sent as base64 in JSON or as a safetensors file. Standard library only (the API server writes, the
client reads with numpy), so neither side needs the ``safetensors`` package.

The safetensors layout (https://huggingface.co/docs/safetensors): an unsigned 64-bit little-endian
header length, a JSON header ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__":
{str: str}}`` padded with spaces to 8 bytes, then the tensors' bytes back to back.
"""

from __future__ import annotations

import json
import struct
from typing import Any

# torch's dtype names (what the worker reports) -> safetensors' names
SAFETENSORS_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}
DTYPE_NAMES = {short: name for name, short in SAFETENSORS_DTYPES.items()}
ITEM_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def encode_safetensors(arrays: dict[str, dict[str, Any]], metadata: dict[str, str]) -> bytes:
    """``arrays``: name -> {"dtype": torch name, "shape": [...], "data": bytes}, in order."""
    header: dict[str, Any] = {"__metadata__": dict(metadata)}
    offset = 0
    for name, array in arrays.items():
        size = len(array["data"])
        header[name] = {"dtype": SAFETENSORS_DTYPES[array["dtype"]], "shape": list(array["shape"]),
                        "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(array["data"] for array in arrays.values())


def decode_safetensors(blob: bytes) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """The inverse of :func:`encode_safetensors`: name -> {"dtype" (torch name), "shape", "data"}, and
    the metadata."""
    (length,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + length])
    metadata = header.pop("__metadata__", {}) or {}
    body = blob[8 + length:]
    arrays = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        arrays[name] = {"dtype": DTYPE_NAMES[info["dtype"]], "shape": list(info["shape"]), "data": body[begin:end]}
    return arrays, metadata


def to_numpy(dtype: str, shape: list[int], data: bytes):
    """One array as numpy; bfloat16 (which numpy lacks) widens exactly to float32."""
    import numpy as np

    if dtype == "bfloat16":
        widened = np.frombuffer(data, dtype="<u2").astype(np.uint32) << 16
        return widened.view(np.float32).reshape(shape)
    return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape).copy()
