"""`tensord inspect`: what an ONNX file is, which providers here can run it, and, for a
decoder export, whether Generate can serve it and how it batches; for a sentence-transformers
folder, whether it is served as an embedding model and how it pools."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import onnx
from onnx.external_data_helper import ExternalDataInfo, uses_external_data

from tensord.backends.onnx_file import read_onnx
from tensord.backends.onnxruntime import available_providers, describe
from tensord.dtypes import dtype_name
from tensord.embedding.folder import (
    embedding_model_file,
    is_embedding_dir,
    read_embedding_folder,
)
from tensord.errors import ModelLoadError
from tensord.generate.model.describe import describe_generator, looks_like_decoder


def inspect_model(path: Path) -> dict[str, Any]:
    """A JSON-ready description of the model file (or of a model folder's: a
    sentence-transformers folder's onnx/model.onnx, else its model.onnx)."""
    folder = _embedding_folder(path)
    if path.is_dir():
        path = path / (embedding_model_file(path) or "model.onnx")
    proto = read_onnx(path)
    runnable, unrunnable, signature = _try_providers(path)
    external = _external_files(path, proto)
    report = {
        "path": str(path),
        "size_bytes": path.stat().st_size,
        "external_data": external,
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
    if folder is not None:
        report["embedding"] = _describe_embedding(folder, path)
    elif looks_like_decoder(path, proto.graph):
        report["generator"] = describe_generator(path)
    return report


def _embedding_folder(path: Path) -> Path | None:
    """The sentence-transformers folder `path` is, or whose model file it is."""
    if path.is_dir():
        return path if embedding_model_file(path) is not None else None
    for folder in (path.parent, path.parent.parent):
        if is_embedding_dir(folder, path.relative_to(folder).as_posix()):
            return folder
    return None


def _describe_embedding(folder: Path, path: Path) -> dict[str, Any]:
    """Whether tensord serves the folder as an embedding model, and how."""
    try:
        spec = read_embedding_folder(folder, path.relative_to(folder).as_posix())
    except ModelLoadError as exc:
        return {"servable": False, "reason": str(exc)}
    return {
        "servable": True,
        "description": spec.describe(),
        "max_seq_length": spec.max_seq_length,
        "pooling": list(spec.pooling) or "graph",
        "normalize": spec.normalize,
        "output": spec.output,
        "dimensions": spec.dimensions or None,
        "prompt": spec.prompt,
    }


def _try_providers(
    path: Path,
) -> tuple[list[str], dict[str, str], dict[str, list[dict[str, Any]]]]:
    """A session on each provider available here: those that run the model, why each
    other one does not, and the inputs and outputs as the first session sees them."""
    import onnxruntime as ort

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
            signature = _signature(session)
    return runnable, unrunnable, signature


def _signature(session: Any) -> dict[str, list[dict[str, Any]]]:
    """The session's inputs and outputs: name, dtype, shape and the graph's dimensions."""
    signature: dict[str, list[dict[str, Any]]] = {}
    for kind, args in (("inputs", session.get_inputs()), ("outputs", session.get_outputs())):
        signature[kind] = [
            {
                "name": s.name,
                "dtype": dtype_name(s.dtype),
                "shape": list(s.shape),
                "dims": _dims(arg.shape),
            }
            for s, arg in zip(describe(args, kind[:-1]), args, strict=True)
        ]
    return signature


def _dims(shape: Any) -> list[int | str]:
    """A shape as the graph names it: sizes, and the names of dynamic dimensions ("?" when
    a dynamic dimension has no name)."""
    return [d if isinstance(d, int) else (d or "?") for d in (shape or [])]


def _external_files(path: Path, proto: onnx.ModelProto) -> list[dict[str, Any]]:
    """The files holding weights outside the model file, with their sizes."""
    locations = sorted(
        {ExternalDataInfo(t).location for t in proto.graph.initializer if uses_external_data(t)}
    )
    found = []
    for location in locations:
        file = path.parent / location
        size = file.stat().st_size if file.is_file() else None
        found.append({"path": str(file), "size_bytes": size})
    return found
