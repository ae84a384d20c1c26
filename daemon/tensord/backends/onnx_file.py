"""An ONNX file read for its graph alone, never its weights."""

from __future__ import annotations

from pathlib import Path

import onnx

from tensord.errors import ModelLoadError


def read_onnx(path: Path) -> onnx.ModelProto:
    """The model's graph without its external data; ModelLoadError when `path` is not an
    ONNX model."""
    if not path.is_file():
        raise ModelLoadError(f"{path} does not exist or is not a file")
    if path.stat().st_size == 0:
        raise ModelLoadError(f"{path} is empty (0 bytes), not an ONNX model")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelLoadError(f"{path} is not a readable ONNX model: {exc}") from None
    # Protobuf parses many byte strings as a message with no fields; a model has a graph.
    if not model.HasField("graph") or not model.opset_import:
        raise ModelLoadError(f"{path} is not an ONNX model: it holds no graph or no opset")
    return model
