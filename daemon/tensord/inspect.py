"""`tensord inspect`: what an ONNX file is and which providers here can run it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx

from tensord.backends.onnxruntime import available_providers, describe
from tensord.codec import dtype_name
from tensord.errors import ModelLoadError


def inspect_model(path: Path) -> dict[str, Any]:
    """A JSON-ready description of the model file."""
    import onnxruntime as ort

    if not path.is_file():
        raise ModelLoadError(f"{path} does not exist or is not a file")
    if path.stat().st_size == 0:
        raise ModelLoadError(f"{path} is empty (0 bytes), not an ONNX model")
    try:
        proto = onnx.load(str(path), load_external_data=False)
    except Exception as exc:
        raise ModelLoadError(f"{path} is not a readable ONNX model: {exc}") from None
    # Protobuf parses many byte strings as a message with no fields; a model has a graph.
    if not proto.HasField("graph") or not proto.opset_import:
        raise ModelLoadError(f"{path} is not an ONNX model: it holds no graph or no opset")
    runnable, unrunnable = [], {}
    signature: dict[str, list[dict[str, Any]]] = {"inputs": [], "outputs": []}
    for provider in available_providers():
        try:
            session = ort.InferenceSession(str(path), providers=[provider])
        except Exception as exc:
            unrunnable[provider] = str(exc).splitlines()[0]
            continue
        if session.get_providers()[0] != provider:
            unrunnable[provider] = f"ONNX Runtime fell back to {session.get_providers()[0]}"
            continue
        runnable.append(provider)
        if not signature["inputs"]:
            for kind, args in (
                ("inputs", session.get_inputs()),
                ("outputs", session.get_outputs()),
            ):
                signature[kind] = [
                    {"name": s.name, "dtype": dtype_name(s.dtype), "shape": list(s.shape)}
                    for s in describe(args, kind[:-1])
                ]
    return {
        "path": str(path),
        "size_bytes": path.stat().st_size,
        "ir_version": proto.ir_version,
        "opsets": {op.domain or "ai.onnx": op.version for op in proto.opset_import},
        "producer": f"{proto.producer_name} {proto.producer_version}".strip(),
        "graph": proto.graph.name,
        "doc": proto.doc_string,
        "metadata": {p.key: p.value for p in proto.metadata_props},
        **signature,
        "runnable_providers": runnable,
        "unrunnable_providers": unrunnable,
    }
