"""An ONNX file read for its graph alone, never its weights."""

from __future__ import annotations

from pathlib import Path
from typing import BinaryIO

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


_MAX_VALUE_INFO = 1 << 20
"""A graph output's ValueInfoProto (name, type, shape, doc) is never larger."""
_GRAPH, _GRAPH_OUTPUT, _VALUE_NAME = 7, 12, 1
"""ModelProto.graph, GraphProto.output and ValueInfoProto.name (onnx.proto's numbers)."""


def graph_output_names(path: Path) -> list[str]:
    """The names of a model file's graph outputs, read by skipping from field to field of
    the protobuf (the weights are seeked over, not read): cheap enough for a repository
    scan. [] when the file is not a readable ONNX model (its load says why)."""
    try:
        with path.open("rb") as f:
            end = path.stat().st_size
            graph = _find_field(f, end, _GRAPH)
            if graph is None:
                return []
            names = []
            start, size = graph
            limit = start + size
            if limit > end:
                return []
            f.seek(start)
            while f.tell() < limit:
                field, wire = _read_tag(f)
                if field == _GRAPH_OUTPUT and wire == 2:
                    length = _read_varint(f)
                    if length > min(limit - f.tell(), _MAX_VALUE_INFO):
                        return []
                    names.append(_value_name(f.read(length)))
                else:
                    _skip(f, wire)
            return [n for n in names if n]
    except (OSError, ValueError, OverflowError, MemoryError):
        return []


def _find_field(f: BinaryIO, end: int, wanted: int) -> tuple[int, int] | None:
    """(offset, size) of the first length-delimited field `wanted` at the top level."""
    while f.tell() < end:
        field, wire = _read_tag(f)
        if field == wanted and wire == 2:
            size = _read_varint(f)
            return f.tell(), size
        _skip(f, wire)
    return None


def _value_name(data: bytes) -> str:
    from io import BytesIO

    f = BytesIO(data)
    while f.tell() < len(data):
        field, wire = _read_tag(f)
        if field == _VALUE_NAME and wire == 2:
            return f.read(_read_varint(f)).decode("utf-8", "replace")
        _skip(f, wire)
    return ""


def _read_varint(f: BinaryIO) -> int:
    value = shift = 0
    while True:
        byte = f.read(1)
        if not byte:
            raise ValueError("truncated varint")
        value |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return value
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _read_tag(f: BinaryIO) -> tuple[int, int]:
    tag = _read_varint(f)
    return tag >> 3, tag & 7


def _skip(f: BinaryIO, wire: int) -> None:
    if wire == 0:
        _read_varint(f)
    elif wire == 1:
        f.seek(8, 1)
    elif wire == 2:
        f.seek(_read_varint(f), 1)
    elif wire == 5:
        f.seek(4, 1)
    else:
        raise ValueError(f"wire type {wire}")
